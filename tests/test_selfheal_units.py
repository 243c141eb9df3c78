"""Units of self-healing without Slurm: the bad-node ledger (concurrent
writers, threshold, window, retraction), the shrink decision (which layouts
run on fewer nodes, which cannot) and the attempt's plan file, the fault summary status and
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
    from launcher.ops.hangwatch import HANG_FLOOR_S, HANG_STEP_FACTOR, STARTUP_TIMEOUT_S, hang_limits
    from launcher.plan.make import make_plan

    base = ["cluster=testcluster", "model=tiny", "cluster.nodes=1", "cluster.gpus_per_node=2"]
    cfg = compose(base)
    spec = RunSpec(cfg, make_plan(cfg), "/tmp/x")
    step, start = hang_limits(spec)
    assert step >= HANG_FLOOR_S and start == STARTUP_TIMEOUT_S
    assert hang_limits(spec, measured_s=30.0) == (30.0 * HANG_STEP_FACTOR, STARTUP_TIMEOUT_S)
    assert hang_limits(spec, measured_s=0.5)[0] == HANG_FLOOR_S  # the floor
    cfg = compose([*base, "launcher.hang_timeout_s=7", "launcher.hang_startup_timeout_s=30"])
    spec = RunSpec(cfg, make_plan(cfg), "/tmp/x")
    assert hang_limits(spec) == (7, 30)
    assert hang_limits(spec, measured_s=30.0) == (7, 30)  # an explicit limit always wins


def _beat(rank: int, step: int, t: float, attempt: str = "0.0", phase: str = "step") -> dict:
    return {
        "rank": rank,
        "node": f"node{rank + 1}",
        "attempt": attempt,
        "phase": phase,
        "step": step,
        "time": t,
    }


def test_hang_limit_follows_the_measured_step_time() -> None:
    """Predicted limit until 3 step intervals were seen, then 20x their median
    (a save between two beats and a poll that misses steps do not move it);
    a new attempt's first beats measure nothing; the stale ranks use it."""
    from launcher.config.compose import compose
    from launcher.config.spec import RunSpec
    from launcher.ops.hangwatch import HANG_STEP_FACTOR, HangWatch, step_limit
    from launcher.plan.make import make_plan

    cfg = compose(["cluster=testcluster", "model=tiny", "cluster.nodes=1", "cluster.gpus_per_node=2"])
    spec = RunSpec(cfg, make_plan(cfg), "/tmp/x")
    said: list[str] = []
    w = HangWatch(spec, said.append)
    predicted = step_limit(spec)
    assert w.step_limit == predicted and "(predicted)" in w.describe()
    # Steps of 10 s; the poll sees steps 1, 2, 4 (two at once), 5, then 6 after a 300 s save.
    t0 = 1000.0
    for step, t in [(1, 0), (2, 10), (4, 30), (5, 40)]:
        assert w.stale({0: _beat(0, step, t0 + t), 1: _beat(1, step, t0 + t + 0.1)}, t0, t0 + t + 1) == {}
        if step < 5:
            assert w.step_limit == predicted and not said
    assert w.clock.step_s() == 10.0 and w.step_limit == 10.0 * HANG_STEP_FACTOR
    assert "(measured)" in w.describe() and "measured step 10 s" in said[0]
    w.stale({0: _beat(0, 6, t0 + 350), 1: _beat(1, 6, t0 + 350)}, t0, t0 + 351)
    assert w.clock.step_s() == 10.0  # median of 10, 10, 10, 310
    # A new attempt resumes at step 3: no interval across the restart.
    w.stale({0: _beat(0, 3, t0 + 900, "0.1"), 1: _beat(1, 3, t0 + 900, "0.1")}, t0 + 880, t0 + 901)
    assert list(w.clock.intervals) == [10.0, 10.0, 10.0, 310.0]
    # Rank 1 silent past the measured limit (200 s), rank 0 still beating.
    hbs = {0: _beat(0, 5, t0 + 1150, "0.1"), 1: _beat(1, 4, t0 + 940, "0.1")}
    (stale,) = w.stale(hbs, t0 + 880, t0 + 1151).items()
    assert stale[0] == 1 and stale[1]["limit_s"] == 200.0 and stale[1]["node"] == "node2"
    # No heartbeat yet: the start-up limit from the attempt's start.
    assert set(w.stale({}, t0, t0 + 901)) == {0, 1}
    assert w.stale({}, t0, t0 + 899) == {}


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


def _plan(*overrides: str):
    from launcher.config.compose import compose
    from launcher.plan.make import make_plan

    cfg = compose(["cluster=testcluster", "model=tiny", *overrides])
    return cfg, make_plan(cfg)


@pytest.mark.parametrize(
    ("overrides", "healthy", "want"),
    [
        # FSDP 2 nodes x 2: dp 4 -> 2, accumulation 1 -> 2, global batch 8 kept.
        (["parallelism=fsdp", "cluster.nodes=2", "cluster.gpus_per_node=2"], 1, (1, 1, 2, 2, 1)),
        # 2 of 3 nodes healthy: dp 2 does not divide the global batch 3, so 1 node (dp 1, 3 steps).
        (
            ["parallelism=fsdp", "cluster.nodes=3", "cluster.gpus_per_node=1", "train.global_batch_size=3"],
            2,
            (1, 1, 1, 3, 1),
        ),
        # HSDP: fewer replicas, the shard group inside a node stays.
        (["parallelism=hsdp", "cluster.nodes=4", "cluster.gpus_per_node=2"], 3, (2, 2, 2, 2, 1)),
        # Pipeline inside a node: more microbatches per step instead of accumulation.
        (
            ["parallelism=fsdp_tp_pp", "parallelism.pp=2", "parallelism.tp=1"]
            + ["cluster.nodes=2", "cluster.gpus_per_node=2"],
            1,
            (1, 1, 1, 1, 8),
        ),
    ],
)
def test_shrink_keeps_tp_pp_and_global_batch(overrides: list[str], healthy: int, want: tuple) -> None:
    from launcher.plan.shrink import shrink_plan

    cfg, plan = _plan(*overrides)
    shrunk, why = shrink_plan(plan, cfg.model, healthy)
    assert shrunk is not None, why
    got = (
        shrunk.nodes,
        shrunk.dp_replicate,
        shrunk.dp_shard,
        shrunk.grad_accum_steps,
        shrunk.pp_microbatches,
    )
    assert got == want
    assert (shrunk.tp, shrunk.pp, shrunk.global_batch_size, shrunk.micro_batch_size) == (
        plan.tp,
        plan.pp,
        plan.global_batch_size,
        plan.micro_batch_size,
    )
    assert shrunk.world_size == shrunk.nodes * plan.ranks_per_node
    assert (
        shrunk.dp
        * shrunk.micro_batch_size
        * shrunk.grad_accum_steps
        * (shrunk.pp_microbatches if plan.pp > 1 else 1)
        == plan.global_batch_size
    )
    assert f"data-parallel degree {plan.dp} -> {shrunk.dp}" in shrunk.reasons[-1]


def test_shrink_refused_naming_why() -> None:
    import dataclasses

    from launcher.plan.shrink import shrink_plan

    # TP x PP spans both nodes: one node cannot hold a replica.
    cfg, plan = _plan(
        "parallelism=fsdp_tp_pp", "parallelism.pp=2", "cluster.nodes=2", "cluster.gpus_per_node=1"
    )
    assert shrink_plan(plan, cfg.model, 1) == (
        None,
        "1 node(s): 1 ranks are not a multiple of tp x pp = 1 x 2",
    )
    # Sharded over half the ranks, the state no longer fits the memory.
    cfg, plan = _plan("parallelism=fsdp", "cluster.nodes=2", "cluster.gpus_per_node=2")
    tight = dataclasses.replace(
        plan, memory=dataclasses.replace(plan.memory, capacity_gb=plan.memory.total_gb)
    )
    shrunk, why = shrink_plan(tight, cfg.model, 1)
    assert shrunk is None and "at dp_shard=2 exceeds" in why and "largest term" in why, why
    # Nothing healthy: nothing to run on.
    assert shrink_plan(plan, cfg.model, 0) == (None, "0 healthy node(s) of the 2 planned: nothing to run on")


def test_attempt_plan_file_replaces_the_plan_without_touching_spec_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    from launcher.config.spec import (
        PLAN_FILE_ENV,
        SPEC_FILE,
        RunSpec,
        SpecError,
        load_spec,
        save_attempt_plan,
        save_spec,
    )
    from launcher.plan.shrink import shrink_plan

    cfg, plan = _plan("parallelism=fsdp", "cluster.nodes=2", "cluster.gpus_per_node=2")
    spec = RunSpec(cfg, plan, str(tmp_path))
    save_spec(spec)
    before = (tmp_path / SPEC_FILE).read_text()
    shrunk, _ = shrink_plan(plan, cfg.model, 1)
    assert shrunk is not None
    path = save_attempt_plan(spec, shrunk, "0.1", shrunk.reasons[-1])
    monkeypatch.setenv(PLAN_FILE_ENV, str(path))
    got = load_spec(tmp_path)
    assert (got.plan.dp, got.plan.grad_accum_steps, got.plan.world_size) == (2, 2, 2)
    assert got.plan.tokens_per_step == plan.tokens_per_step
    assert got.plan_file == str(path) and got.plan_why.startswith("shrunk from 2 to 1 node(s)")
    assert (tmp_path / SPEC_FILE).read_text() == before
    # A plan that changes what the run computes is refused, naming the field.
    bad = save_attempt_plan(spec, dataclasses.replace(shrunk, global_batch_size=4), "0.2", "x")
    monkeypatch.setenv(PLAN_FILE_ENV, str(bad))
    with pytest.raises(SpecError, match=r"plan\.global_batch_size=4 differs from spec\.json's 8"):
        load_spec(tmp_path)
    # Another run's plan file is refused.
    other = RunSpec(cfg, plan, str(tmp_path / "other"))
    monkeypatch.setenv(PLAN_FILE_ENV, str(save_attempt_plan(other, shrunk, "0.1", "x")))
    with pytest.raises(SpecError, match="written for run dir"):
        load_spec(tmp_path)
