"""Units of self-healing without Slurm: the bad-node ledger (concurrent
writers, threshold, window, retraction), the shrink decision (which layouts
run on fewer nodes, which cannot) and the attempt's plan file, the fault summary status and
Prometheus show, the hang limits' defaults, `meshrun nodes`, and refusals
of the new fields. The cluster scenarios are tests/cluster/test_selfheal.py.
Tests that start no process: tests/unit/test_selfheal_logic.py."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.config import nodeledger

ROOT = Path(__file__).resolve().parents[2]


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


def test_hang_limits_defaults_and_overrides() -> None:
    from launcher.config.compose import compose
    from launcher.config.spec import RunSpec
    from launcher.plan.make import make_plan
    from launcher.selfheal.hangwatch import HANG_FLOOR_S, HANG_STEP_FACTOR, STARTUP_TIMEOUT_S, hang_limits

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


def test_quiet_ranks_of_a_script_job_follow_the_ranks_that_report_steps(tmp_path: Path) -> None:
    """A team's program that prints its progress on rank 0 only: the other
    ranks (no step reported) are not ended as hung at the start-up limit
    while rank 0 steps; rank 0's silence is still a hang; a job whose output
    never matches is still hung at the start-up limit; meshrun's trainer
    (each rank beats itself) keeps the per-rank rule."""
    from launcher.config.compose import compose
    from launcher.config.spec import RunSpec
    from launcher.plan.make import make_plan
    from launcher.selfheal.hangwatch import HangWatch

    t0 = 1000.0
    base = ["cluster=testcluster", "cluster.nodes=1", "cluster.gpus_per_node=2",
            "launcher.hang_timeout_s=30", "launcher.hang_startup_timeout_s=100"]  # fmt: skip
    cfg = compose(["job=script", "job.script=tests/programs/ddp_toy.py", *base])
    w = HangWatch(RunSpec(cfg, make_plan(cfg), "/tmp/x"), lambda _: None)
    quiet = _beat(1, 0, t0, phase="startup")
    assert w.stale({0: _beat(0, 500, t0 + 990), 1: quiet}, t0, t0 + 1000) == {}
    assert set(w.stale({0: _beat(0, 500, t0 + 960), 1: quiet}, t0, t0 + 1000)) == {0}
    assert set(w.stale({0: _beat(0, 0, t0, phase="startup"), 1: quiet}, t0, t0 + 101)) == {0, 1}
    # Once rank 0's program has completed, the quiet rank has the step limit
    # from its end; a rank 0 that stopped (srun's SIGTERM after another
    # rank's kill, a requeue) leaves it the start-up limit from its own beat.
    run = tmp_path / "run"
    run.mkdir()
    cfg = compose(["job=script", "job.script=tests/programs/ddp_toy.py", *base])
    w = HangWatch(RunSpec(cfg, make_plan(cfg), str(run)), lambda _: None)
    done = _beat(0, 500, t0 + 990, phase="done")
    late = _beat(1, 0, t0 + 960, phase="startup")
    (run / "result.json").write_text(json.dumps({"final_step": 500, "status": "preempted"}))
    assert w.stale({0: done, 1: late}, t0, t0 + 1021) == {}
    assert set(w.stale({0: done, 1: late}, t0, t0 + 1061)) == {1}
    (run / "result.json").write_text(json.dumps({"final_step": 500, "status": "completed"}))
    assert w.stale({0: done, 1: late}, t0, t0 + 1019) == {}
    assert set(w.stale({0: done, 1: late}, t0, t0 + 1021)) == {1}
    cfg = compose(["model=tiny", *base])
    w = HangWatch(RunSpec(cfg, make_plan(cfg), "/tmp/x"), lambda _: None)
    assert set(w.stale({0: _beat(0, 500, t0 + 990), 1: quiet}, t0, t0 + 1000)) == {1}


def test_a_quiet_rank_outliving_rank_0s_completed_program_ends_the_run(tmp_path: Path) -> None:
    """job=script: rank 0's program completed (result.json of this attempt)
    and the ranks still running never reported a step: their teardown hangs
    (rank 0's process held the rendezvous store), not the training. Any
    other shape is a hang as before."""
    from launcher.selfheal.hangend import program_ended

    t0 = time.time() - 300
    run = str(tmp_path)
    done, quiet = _beat(0, 240, t0 + 100, phase="done"), _beat(1, 0, t0, phase="startup")
    stale = {1: {"phase": "startup"}}
    result = tmp_path / "result.json"
    assert program_ended("script", 2, run, t0, {0: done, 1: quiet}, stale) == ""  # no result yet
    result.write_text(json.dumps({"final_step": 240, "final_loss": None, "status": "completed"}))
    why = program_ended("script", 2, run, t0, {0: done, 1: quiet}, stale)
    assert why.startswith("rank 0's program completed at step 240; rank(s) [1]"), why
    trained = {0: done, 1: _beat(1, 7, t0, phase="step")}
    assert program_ended("script", 2, run, t0, trained, stale) == ""  # it trained: a hang
    assert program_ended("script", 2, run, t0, {0: _beat(0, 240, t0), 1: quiet}, {0: {}, 1: {}}) == ""
    assert program_ended("script", 2, run, time.time() + 60, {0: done, 1: quiet}, stale) == ""  # older result
    assert program_ended("script", 3, run, t0, {0: done, 1: quiet}, stale) == ""  # a rank not seen yet
    assert program_ended("train", 2, run, t0, {0: done, 1: quiet}, stale) == ""  # meshrun's trainer
    result.write_text(json.dumps({"final_step": 240, "final_loss": None, "status": "failed"}))
    assert program_ended("script", 2, run, t0, {0: done, 1: quiet}, stale) == ""


def test_hang_limit_follows_the_measured_step_time() -> None:
    """Predicted limit until 3 step intervals were seen, then 20x their median
    (a save between two beats and a poll that misses steps do not move it);
    a new attempt's first beats measure nothing; the stale ranks use it."""
    from launcher.config.compose import compose
    from launcher.config.spec import RunSpec
    from launcher.plan.make import make_plan
    from launcher.selfheal.hangwatch import HANG_STEP_FACTOR, HangWatch, step_limit

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
        ("launcher.burnin_passes=1", "launcher.burnin_passes"),
        ("launcher.burnin_interval_s=0", "launcher.burnin_interval_s"),
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
        [
            sys.executable,
            "-m",
            "launcher.selfheal",
            str(tmp_path / "nosuch"),
            "--",
            str(fake),
            "x",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode == 3 and out.stdout.strip() == "ran: x", out
    assert "cannot supervise (SpecError" in out.stderr and "one srun, no restart" in out.stderr


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

    from launcher.config.runfiles import SPEC_FILE
    from launcher.config.spec import (
        PLAN_FILE_ENV,
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


def test_meshrun_nodes_shows_probation_and_cleared(tmp_path: Path) -> None:
    path = tmp_path / nodeledger.LEDGER_FILE
    for node in ("node2", "node3"):
        nodeledger.append(
            path, {"node": node, "cause": "signal", "run": "r1", "job": "9", "detail": "Killed"}
        )
        nodeledger.append(path, {"node": node, "burnin": "pass", "run": "r1", "job": "9", "detail": "ok"})
    nodeledger.append(path, {"node": "node3", "burnin": "pass", "run": "r1", "cleared": True, "detail": "ok"})
    out = subprocess.run(
        [sys.executable, "-m", "launcher.cli", "nodes", f"--runs-root={tmp_path}", "--min-faults=1"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    assert "node2: on probation: 1 burn-in(s) passed in a row since its newest fault" in out.stdout
    assert "node3: cleared by burn-ins: its earlier faults no longer count" in out.stdout
    assert "node2: 1 fault(s)" in out.stdout and "node3: 1 fault(s)" not in out.stdout, out.stdout


def test_a_script_job_is_never_shrunk_and_a_requeue_leaves_its_partition_enough_nodes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A team's program sized itself for its planned world: too few healthy
    nodes is a requeue, never a shrink. The requeue's ExcNodeList never
    leaves the partition fewer nodes than the job asks for (it would pend
    forever, BadConstraints): the oldest exclusions are dropped, said."""
    from launcher.config.compose import compose
    from launcher.config.spec import RunSpec
    from launcher.plan.make import make_plan
    from launcher.selfheal import restart
    from launcher.selfheal.records import FaultRecords
    from launcher.selfheal.state import SupervisorState

    base = ["cluster=testcluster", "cluster.nodes=2", "cluster.gpus_per_node=2", "cluster.spare_nodes=1"]
    cfg = compose(["job=script", "job.script=tests/programs/ddp_toy.py", *base])
    st = SupervisorState("/tmp/x", RunSpec(cfg, make_plan(cfg), "/tmp/x"), Path("/tmp/x/bad_nodes.jsonl"))
    pol = restart.RestartPolicy(st, FaultRecords(st))
    plan, why = restart.layout_for(pol.state.spec, ["node3"])
    assert plan is None and "job=script runs on its planned nodes only" in why
    assert restart.layout_for(pol.state.spec, ["node1", "node3"])[0] is pol.state.spec.plan
    trainer = compose(["model=tiny", *base])
    pol.state.spec = RunSpec(trainer, make_plan(trainer), "/tmp/x")
    assert restart.layout_for(pol.state.spec, ["node3"])[0].nodes == 1  # the trainer reshards: shrunk

    said: list[str] = []
    monkeypatch.setattr(restart, "say", said.append)
    monkeypatch.setattr(
        restart, "slurm_cmd", lambda args, timeout=20: subprocess.CompletedProcess(args, 0, "node[1-4]\n", "")
    )
    monkeypatch.setattr(restart, "hostnames", lambda expr: [f"node{i}" for i in range(1, 5)])
    # 3 nodes needed of 4: at most one excluded; this fault's node is kept out.
    assert pol.startable(["node1", "node2", "node3"], bad=["node3"]) == ["node3"]
    assert said and "not excluding node1,node2" in said[-1]
    assert pol.startable(["node2"], bad=["node2"]) == ["node2"]
    monkeypatch.setattr(
        restart, "slurm_cmd", lambda args, timeout=20: subprocess.CompletedProcess(args, 1, "", "x")
    )
    assert pol.startable(["node1", "node2", "node3"], bad=["node3"]) == ["node1", "node2", "node3"]
