"""Issue 35 (items 2, 3, 5, 6) without a Slurm job: node names read back from
the shared runs root are checked before any use (the bad-node ledger, a
non-numeric time, ``meshrun nodes --drain``); rank causes ordered in
attribution; a requeue's ExcNodeList merged; the supervisor never starts an
attempt after a stop signal and forwards a stop to an attempt it started.
``meshrun nodes`` as a process: tests/local/test_ops_hardening_nodes.py; the
requeue's merge (asks sinfo): tests/local/test_ops_hardening_requeue.py; the
supervisor after a stop: tests/cluster/test_ops_hardening_cluster.py; the
cluster halves are in tests/cluster/test_selfheal.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from harness import INJECTED_NODE, poisoned_ledger

from launcher.config import nodeledger, nodename


def test_node_names_follow_slurm_host_name_rules() -> None:
    for ok in ("node1", "gpu-a100-07", "n_1.cluster.example", "7"):
        assert nodename.is_node_name(ok) and nodename.problem(ok) is None
    for bad in (
        INJECTED_NODE,
        "gpu[001-512]",
        "a,b",
        "a b",
        "-x",
        ".x",
        "a;b",
        "a$(id)",
        "",
        "n\x1b",
        7,
        None,
    ):
        assert not nodename.is_node_name(bad), bad
    assert nodename.node_list(["node2", "node1", "node2"]) == "node1,node2"
    with pytest.raises(ValueError, match=r"'gpu\[001-512\]' is not a Slurm host name"):
        nodename.node_list(["node1", "gpu[001-512]"])


def test_ledger_skips_bad_names_and_times_with_one_warning(tmp_path: Path) -> None:
    import time

    path = tmp_path / nodeledger.LEDGER_FILE
    now = time.time()
    poisoned_ledger(path, now)
    said: list[str] = []
    recs = nodeledger.read(path, said.append)
    assert [r["node"] for r in recs] == ["node4", "node4"]
    assert len(said) == 1, said
    assert said[0].startswith(f"{path}: skipped 7 unusable line(s): line 2: time 'yesterday' is not a number")
    assert "line 3: node name 'node1\\ntouch" in said[0] and "line 4: node name 'gpu[001-512]'" in said[0]
    assert said[0].endswith("; and 4 more")
    assert list(nodeledger.bad_nodes(recs, 2, 1.0, now)) == ["node4"]
    # Records that did not come through read() are checked as well.
    raw = [json.loads(x) for x in path.read_text().splitlines()[:7]]
    assert list(nodeledger.bad_nodes(raw, 1, 1.0, now)) == ["node4"]


def test_submission_excludes_only_checked_names(tmp_path: Path) -> None:
    """The ledger -> ``#SBATCH --exclude`` path: the injected line never
    reaches the script (submitit's own writer renders it here;
    tests/cluster/test_selfheal.py submits one to the test cluster), and the last
    guard before sbatch refuses any unchecked name."""
    import time

    from submitit.slurm.slurm import _make_sbatch_string

    from launcher.config.compose import compose
    from launcher.config.spec import RunSpec
    from launcher.plan.make import make_plan
    from launcher.slurm import submit
    from launcher.slurm.render import task_command

    poisoned_ledger(tmp_path / nodeledger.LEDGER_FILE, time.time())
    cfg = compose(
        ["cluster=testcluster", "model=tiny", f"launcher.runs_root={tmp_path}", "launcher.bad_node_faults=1"]
    )
    spec = RunSpec(cfg, make_plan(cfg), str(tmp_path / "run"))
    params, excluded = submit.run_parameters(spec, tmp_path / "run" / "slurm")
    assert list(excluded) == ["node4"] and params["exclude"] == "node4"
    shown = {k: v for k, v in params.items() if k != "srun_args"}
    script = _make_sbatch_string(command=task_command(spec), folder=str(tmp_path), **shown)
    assert "#SBATCH --exclude=node4\n" in script
    assert "touch" not in script and "gpu[" not in script
    with pytest.raises(ValueError, match="not a Slurm host name"):
        submit._submit(
            spec, tmp_path / "run" / "slurm", "true", {**params, "exclude": f"node4,{INJECTED_NODE}"}
        )
    assert not (tmp_path / "run").exists()  # refused before anything is written


# --- item 5: rank causes ordered -------------------------------------------
BUG = (100.0, 0, "RuntimeError: injected bug at step 3")
GLOO_PEER = (100.3, 2, "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:1422")
EXIT0 = "srun: error: node1: task 0: Exited with exit code 1"
ABORT2 = "srun: error: node2: task 2: Aborted"
KILL3 = "srun: error: node2: task 3: Killed"
TERM = "srun: error: node2: tasks 2-3: Terminated"


@pytest.mark.parametrize(
    "srun_errors",
    [
        [(100.5, EXIT0), (101.5, ABORT2)],  # the real error's task first, the watchdog's abort 1 s later
        [(100.2, ABORT2), (100.6, EXIT0)],  # the abort's line first (srun's order is a race)
        [(100.2, ABORT2), (100.3, KILL3), (100.6, EXIT0), (101.0, TERM)],  # even a SIGKILL within the race
    ],
)
def test_the_earliest_real_python_error_is_blamed_not_a_watchdog_abort(srun_errors: list) -> None:
    """Rank 0 raised a real error; a survivor on node2 was SIGABRTed by its
    NCCL watchdog within seconds (the cascade): node2 is never blamed, in
    either order of srun's lines. Before: the abort's node was."""
    from launcher.selfheal.attribution import first_cause, signalled_line

    errors = [BUG, GLOO_PEER]
    assert signalled_line(srun_errors, errors) is None
    assert signalled_line(srun_errors, errors, weak=True) is None
    assert first_cause(errors) == BUG


def test_sigkill_and_oom_rank_above_sigabrt_and_sigterm() -> None:
    from launcher.selfheal.attribution import signalled_line

    peers = [GLOO_PEER]  # survivors only lost their peer: no real error
    # The abort came first in time, the SIGKILL is still the cause; then an OOM kill likewise.
    assert signalled_line([(100.0, ABORT2), (100.4, KILL3)], peers) == (100.4, KILL3)
    oom = "srun: error: node3: task 5: Out Of Memory"
    assert signalled_line([(100.0, TERM), (100.1, ABORT2), (100.9, oom)], peers) == (100.9, oom)
    # An abort alone is blamed only as the weakest cause (after the peer a connection error names).
    assert signalled_line([(100.0, ABORT2)], peers) is None
    assert signalled_line([(100.0, ABORT2)], peers, weak=True) == (100.0, ABORT2)
    # srun's own SIGTERM of the rest never is.
    assert signalled_line([(100.0, TERM)], [], weak=True) is None
