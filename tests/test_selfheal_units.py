"""Units of self-healing without Slurm: the bad-node ledger (concurrent
writers, threshold, window, retraction), the fault summary status and
Prometheus show, the hang limits' defaults, `meshrun nodes`, and refusals
of the new fields. The cluster scenarios are tests/test_selfheal.py."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.config import nodeledger
from launcher.config.health import fault_summary, read_faults

ROOT = Path(__file__).resolve().parent.parent


def _writer(path: str, i: int) -> None:
    for k in range(50):
        nodeledger.append(
            Path(path), {"node": f"node{i}", "cause": "signal", "run": f"r{k}", "detail": "x" * 300}
        )


def test_ledger_concurrent_writers_lose_no_line(tmp_path: Path) -> None:
    path = tmp_path / "bad_nodes.jsonl"
    procs = [multiprocessing.Process(target=_writer, args=(str(path), i)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    lines = path.read_text().splitlines()
    assert len(lines) == 200
    assert all(json.loads(x)["detail"] == "x" * 300 for x in lines)  # no torn line
    assert {n: len(r) for n, r in nodeledger.bad_nodes(nodeledger.read(path), 50, 1).items()} == {
        f"node{i}": 50 for i in range(4)
    }


def test_bad_nodes_threshold_window_and_retraction() -> None:
    now = time.time()
    recs = [
        {"node": "a", "cause": "hang", "run": "r1", "time": now - 10},
        {"node": "a", "cause": "signal", "run": "r2", "time": now - 20},
        {"node": "b", "cause": "signal", "run": "r1", "time": now - 10},
        {"node": "b", "cause": "signal", "run": "r3", "time": now - 3 * 3600},  # outside a 1 h window
        {"node": "c", "cause": "error", "run": "r4", "time": now - 10},
        {"node": "c", "cause": "error", "run": "r4", "time": now - 5},
        {"node": "c", "run": "r4", "retract": True, "cause": "the code's", "time": now},
    ]
    bad = nodeledger.bad_nodes(recs, 2, 1.0, now)
    assert list(bad) == ["a"]
    assert nodeledger.describe("a", bad["a"]) == "a: 2 fault(s) (hang, signal)"
    assert list(nodeledger.bad_nodes(recs, 2, 4.0, now)) == ["a", "b"]
    assert list(nodeledger.bad_nodes(recs, 1, 1.0, now)) == ["a", "b"]  # c retracted


def test_fault_summary_counts_and_seconds_lost(tmp_path: Path) -> None:
    lines = [
        {"cause": "signal", "node": "n1", "action": "restart", "attempt": "0.0", "error": "task 1: Killed"},
        {"event": "resumed", "cause": "signal", "seconds_lost": 26.5, "steps_redone": 5, "first_step": 6},
        {"cause": "hang", "node": "n2", "action": "requeue", "attempt": "0.1", "error": "no progress"},
        {"event": "resumed", "cause": "hang", "seconds_lost": 40.0, "steps_redone": 3, "first_step": 9},
    ]
    (tmp_path / "faults.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + "{torn")
    s = fault_summary(read_faults(tmp_path))
    assert s["faults"] == 2 and s["by_cause"] == {"signal": 1, "hang": 1}
    assert (s["restarts"], s["requeues"], s["seconds_lost"], s["steps_redone"]) == (1, 1, 66.5, 8)
    assert s["last"] == "hang on n2: no progress (requeue)"
    from launcher.ops.status import Row, fault_lines

    (line,) = fault_lines([Row("run", str(tmp_path), "7")])
    assert "faults 2 (hang 1, signal 1); restarts 1, requeues 1; lost 66.5 s, 8 step(s) redone" in line


def test_hang_limits_defaults_and_overrides() -> None:
    from launcher.config.compose import compose
    from launcher.config.spec import RunSpec
    from launcher.ops.supervise import HANG_FLOOR_S, STARTUP_TIMEOUT_S, hang_limits
    from launcher.plan.make import make_plan

    base = ["cluster=testcluster", "model=tiny", "cluster.nodes=1", "cluster.gpus_per_node=2"]
    cfg = compose(base)
    step, start = hang_limits(RunSpec(cfg, make_plan(cfg), "/tmp/x"))
    assert step >= HANG_FLOOR_S and start == STARTUP_TIMEOUT_S
    cfg = compose([*base, "launcher.hang_timeout_s=7", "launcher.hang_startup_timeout_s=30"])
    assert hang_limits(RunSpec(cfg, make_plan(cfg), "/tmp/x")) == (7, 30)


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("launcher.hang_timeout_s=-1", "launcher.hang_timeout_s"),
        ("launcher.bad_node_faults=0", "launcher.bad_node_faults"),
        ("cluster.spare_nodes=-1", "cluster.spare_nodes"),
    ],
)
def test_new_fields_refused_naming_them(override: str, field: str) -> None:
    from launcher.config.compose import compose
    from launcher.config.validate import ConfigError, check_ranges

    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        check_ranges(compose(["cluster=testcluster", override]))


def test_meshrun_nodes_lists_drain_lines_without_running_them(tmp_path: Path) -> None:
    path = tmp_path / nodeledger.LEDGER_FILE
    for run in ("r1", "r2"):
        nodeledger.append(
            path, {"node": "node4", "cause": "hang", "run": run, "job": "9", "detail": "no progress"}
        )
    nodeledger.append(path, {"node": "node2", "cause": "signal", "run": "r1", "job": "9", "detail": "Killed"})
    out = subprocess.run(
        [sys.executable, "-m", "launcher.cli", "nodes", f"--runs-root={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    assert "node4: 2 fault(s)" in out.stdout and "node2" not in out.stdout
    assert (
        "admin: scontrol update NodeName=node4 State=DRAIN 'Reason=meshrun: 2 fault(s) (hang)" in out.stdout
    )
    assert "drained" not in out.stdout


def test_supervisor_that_cannot_start_runs_one_plain_srun(tmp_path: Path) -> None:
    """No spec (or no scontrol) on the batch host: the step still runs, once."""
    fake = tmp_path / "srun"
    fake.write_text('#!/bin/sh\necho "ran: $*"\nexit 3\n')
    fake.chmod(0o755)
    out = subprocess.run(
        [sys.executable, "-m", "launcher.ops.supervise", str(tmp_path / "nosuch"), "--", str(fake), "x"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode == 3 and out.stdout.strip() == "ran: x", out
    assert "cannot supervise (SpecError" in out.stderr and "one srun, no restart" in out.stderr


def test_signalled_task_wins_over_a_survivors_peer_error() -> None:
    """srun names the SIGKILLed task after a survivor's 'closed by peer' exit
    (the race seen on the test cluster): the signalled task's node is blamed.
    A Python error followed by kills after KillWait blames the error."""
    from launcher.ops.attribution import signalled_line

    srun_errors = [
        (101.0, "srun: error: node2: task 0: Exited with exit code 1"),
        (101.2, "srun: error: node3: task 3: Killed"),
    ]
    peer = [(100.9, 0, "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:1422")]
    assert signalled_line(srun_errors, peer) == (101.2, "srun: error: node3: task 3: Killed")
    bug = [(100.9, 0, "RuntimeError: injected bug at step 3")]
    srun_errors[1] = (131.0, "srun: error: node3: task 3: Killed")  # after KillWait
    assert signalled_line(srun_errors, bug) is None
    assert signalled_line([(101.0, "srun: error: node2: tasks 0-1: Terminated")], []) is None
