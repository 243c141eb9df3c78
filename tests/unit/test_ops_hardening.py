"""Issue 35 (items 2, 3, 5, 6) without a Slurm job: node names read back from
the shared runs root are checked before any use (the bad-node ledger, a
non-numeric time, ``meshrun nodes --drain``); rank causes ordered in
attribution; a requeue's ExcNodeList merged; the supervisor never starts an
attempt after a stop signal and forwards a stop to an attempt it started.
The cluster halves are in tests/cluster/test_selfheal.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.config import nodeledger, nodename

ROOT = Path(__file__).resolve().parents[2]
INJECTED = "node1\ntouch /tmp/meshrun-pwned #"


def _poisoned_ledger(path: Path, now: float) -> None:
    """node4: two good faults; then lines another user of the runs root could write."""
    good = {"cause": "hang", "run": "r1", "job": "9", "detail": "no progress"}
    lines = [
        json.dumps({**good, "node": "node4", "time": now - 10}),
        json.dumps({**good, "node": "node3", "time": "yesterday"}),
        json.dumps({**good, "node": INJECTED, "time": now - 10}),
        json.dumps({**good, "node": "gpu[001-512]", "time": now - 10}),
        json.dumps({**good, "node": "node2,node3", "time": now - 10}),
        json.dumps({**good, "node": "-x", "time": now - 10}),
        json.dumps({**good, "node": "node3", "time": True}),
        '{"node": "node4", "ti',  # torn
        json.dumps({**good, "node": "node4", "time": now - 5, "run": "r2"}),
    ]
    path.write_text("\n".join(lines) + "\n")


def test_node_names_follow_slurm_host_name_rules() -> None:
    for ok in ("node1", "gpu-a100-07", "n_1.cluster.example", "7"):
        assert nodename.is_node_name(ok) and nodename.problem(ok) is None
    for bad in (INJECTED, "gpu[001-512]", "a,b", "a b", "-x", ".x", "a;b", "a$(id)", "", "n\x1b", 7, None):
        assert not nodename.is_node_name(bad), bad
    assert nodename.node_list(["node2", "node1", "node2"]) == "node1,node2"
    with pytest.raises(ValueError, match=r"'gpu\[001-512\]' is not a Slurm host name"):
        nodename.node_list(["node1", "gpu[001-512]"])


def test_ledger_skips_bad_names_and_times_with_one_warning(tmp_path: Path) -> None:
    import time

    path = tmp_path / nodeledger.LEDGER_FILE
    now = time.time()
    _poisoned_ledger(path, now)
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


def _nodes(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "launcher.cli", "nodes", f"--runs-root={tmp_path}", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


def test_meshrun_nodes_and_drain_use_only_checked_names(tmp_path: Path) -> None:
    """A non-numeric time does not break ``meshrun nodes``; ``--drain`` runs
    scontrol for node4 only (a fake scontrol records its argv: draining the
    shared test cluster's nodes is not a test's to do)."""
    import time

    _poisoned_ledger(tmp_path / nodeledger.LEDGER_FILE, time.time())
    out = _nodes(tmp_path, "--min-faults=1")
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("meshrun: warning:") == 1 and "line 2: time 'yesterday'" in out.stderr
    assert "node4: 2 fault(s)" in out.stdout and "touch" not in out.stdout and "gpu[" not in out.stdout
    bin_dir, log = tmp_path / "bin", tmp_path / "scontrol.log"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\nprintf "%s|" "$@" >> {log}\necho >> {log}\n')
    (bin_dir / "scontrol").chmod(0o755)
    out = _nodes(tmp_path, "--min-faults=1", "--drain", env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert out.returncode == 0, out.stderr
    assert log.read_text().splitlines() == [
        "update|NodeName=node4|State=DRAIN|Reason=meshrun: 2 fault(s) (hang), last run r2|"
    ]
    from launcher.nodecheck.ledgerview import drain_command

    with pytest.raises(ValueError, match="not a Slurm host name"):
        drain_command("gpu[001-512]", [{"cause": "hang"}])


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

    _poisoned_ledger(tmp_path / nodeledger.LEDGER_FILE, time.time())
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
        submit._submit(spec, tmp_path / "run" / "slurm", "true", {**params, "exclude": f"node4,{INJECTED}"})
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


# --- items 3 and 6: the supervisor after a fault --------------------------
FAKE_SRUN = """#!/bin/sh
# srun stand-in: attempt x.0 fails on node1; later ones beat and wait for a stop.
echo "start $MESHRUN_ATTEMPT" >> "$LOG"
case "$MESHRUN_ATTEMPT" in *.0)
  echo "srun: error: node1: task 0: Exited with exit code 1" >&2; exit 1;;
esac
trap 'echo "USR2 $MESHRUN_ATTEMPT" >> "$LOG"; kill $!; exit 75' USR2
mkdir -p "$RUN/heartbeats"
printf '{"rank": 0, "attempt": "%s", "node": "node2", "phase": "start", "step": 0, "time": %s}' \\
  "$MESHRUN_ATTEMPT" "$(date +%s)" > "$RUN/heartbeats/rank0.json"
sleep 20 & wait $!
echo "never stopped $MESHRUN_ATTEMPT" >> "$LOG"
"""


def _supervised_run(tmp_path: Path) -> tuple[Path, Path]:
    from launcher.config.compose import compose
    from launcher.config.spec import RunSpec, save_spec
    from launcher.plan.make import make_plan

    run = tmp_path / "run"
    cfg = compose(
        ["cluster=testcluster", "model=tiny", "cluster.gpus_per_node=1", f"launcher.runs_root={tmp_path}"]
    )
    save_spec(RunSpec(cfg, make_plan(cfg), str(run)))
    srun = tmp_path / "bin" / "srun"
    srun.parent.mkdir()
    srun.write_text(FAKE_SRUN)
    srun.chmod(0o755)
    return run, srun


@pytest.mark.slurm
@pytest.mark.parametrize("stop_at", ["attribution", "start"])
def test_supervisor_never_starts_after_a_stop_and_forwards_one(
    tmp_path: Path, stop_at: str, slurm_env: str
) -> None:
    """Attempt 0 fails on node1; the restart goes to node2. A stop that came
    during attribution: attempt 1 is never started, exit 76 (requeue or end,
    as any stop; no final save). A stop that came as attempt 1 started: its
    tasks get USR2 and save (exit 75). Before: attempt 1 started and trained
    on, never told. The supervisor's own process with a stand-in srun
    (tests/stop_race_supervisor.py: why no real job), Slurm's test cluster
    for the node queries."""
    run, srun = _supervised_run(tmp_path)
    log = tmp_path / "srun.log"
    env = {**os.environ, "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_ID": "", "STOP_AT": stop_at}
    env.update(LOG=str(log), RUN=str(run), PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "stop_race_supervisor.py"), str(run), "--", str(srun)],
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
        cwd=ROOT,
    )
    starts = log.read_text().splitlines()
    fault = json.loads((run / "faults.jsonl").read_text().splitlines()[0])
    assert (fault["node"], fault["action"]) == ("node1", "restart"), fault
    if stop_at == "attribution":
        assert out.returncode == 76, (out.returncode, out.stderr[-2000:])
        assert starts == ["start 0.0"], starts
        assert "stop signal SIGUSR2 before attempt 0.1 started: not starting it" in out.stderr
    else:
        assert out.returncode == 75, (out.returncode, out.stderr[-2000:])
        assert starts == ["start 0.0", "start 0.1", "USR2 0.1"], starts
        assert "stop signal SIGTERM: passing USR2 to attempt 0.1" in out.stderr


def test_requeue_exclusions_merge_the_jobs_and_the_ledgers(tmp_path: Path) -> None:
    """ExcNodeList after a requeue = the job's own (job_excluded, from
    scontrol: tests/cluster/test_selfheal.py proves it on the cluster) + the
    ledger's bad nodes + the new ones, each checked."""
    import time

    from launcher.config.compose import compose
    from launcher.config.spec import RunSpec
    from launcher.plan.make import make_plan
    from launcher.selfheal.records import FaultRecords
    from launcher.selfheal.restart import RestartPolicy
    from launcher.selfheal.state import SupervisorState

    _poisoned_ledger(tmp_path / nodeledger.LEDGER_FILE, time.time())
    cfg = compose(["cluster=testcluster", "model=tiny", f"launcher.runs_root={tmp_path}"])
    st = SupervisorState(str(tmp_path), RunSpec(cfg, make_plan(cfg), str(tmp_path)), nodeledger.ledger_path(cfg))
    pol = RestartPolicy(st, FaultRecords(st))
    assert pol.excluded_after_requeue(["node2", "node1"]) == "node1,node2,node4"
    assert pol.excluded_after_requeue([INJECTED]) == "node4"
