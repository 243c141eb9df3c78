"""Units of self-healing without Slurm: the bad-node ledger (concurrent
writers, threshold, window, retraction), the shrink decision (which layouts
run on fewer nodes, which cannot) and the attempt's plan file, the fault summary status and
Prometheus show, the hang limits' defaults, `meshrun nodes`, and refusals
of the new fields. The cluster scenarios are tests/cluster/test_selfheal.py."""

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
    from launcher.views.runstate import Row, fault_lines

    (line,) = fault_lines([Row("run", str(tmp_path), "7")])
    assert "faults 2 (hang 1, signal 1); restarts 1, requeues 1; lost 66.5 s, 8 step(s) redone" in line


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


def test_signalled_task_wins_over_a_survivors_peer_error() -> None:
    """srun names the SIGKILLed task after a survivor's 'closed by peer' exit
    (the race seen on the test cluster): the signalled task's node is blamed.
    A Python error followed by kills after KillWait blames the error."""
    from launcher.selfheal.attribution import signalled_line

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


# Real texts. gloo (torch 2.13.0+cpu, this machine): 4 ranks, each its own
# gloo device address 127.0.0.(10 + rank), rank 1 SIGKILLed in an
# all_reduce loop; each survivor's `f"{type(e).__name__}: {e}"` and when it
# raised (seconds after the first). Rank 0 names the victim's outgoing
# socket (the kernel's source address on loopback, 127.0.0.1: no node's);
# rank 3 raised 0.7 s later, naming rank 0, which had exited: a cascade.
_PAIR = "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:"
GLOO_KILL_RANK1 = [
    (
        0.000,
        2,
        _PAIR
        + "553] Connection closed by peer [127.0.0.11]:899. This is typically caused by a remote worker "
        "crashing. Check the logs of the remote worker before reporting an error. GLHF! 🏖️",
    ),
    (
        0.005,
        0,
        _PAIR + "537] Read error [127.0.0.1]:32457: Connection reset by peer. This is typically caused by a "
        "remote worker hanging or bugs in the application. Check the logs of the remote worker before "
        "reporting an error. GLHF! 🏖️",
    ),
    (
        0.695,
        3,
        _PAIR
        + "553] Connection closed by peer [127.0.0.10]:45965. This is typically caused by a remote worker "
        "crashing. Check the logs of the remote worker before reporting an error. GLHF! 🏖️",
    ),
]
# NCCL, as PyTorch raises it (DistBackendError's text, several lines) and as
# NCCL warns, from public reports: NVIDIA/nccl#2076 (address elided there),
# NVIDIA/nccl#1514, NVIDIA/nccl#1612, NVIDIA/nccl#795,
# tatsu-lab/stanford_alpaca#207, NVIDIA/nccl-tests#166.
NCCL_2076 = (
    "DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:268, remote process "
    "exited or there was a network error, NCCL version 2.21.5\n"
    "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.\n"
    "Last error:\n"
    "socketProgressOpt: Call to recv from 172....<33759> failed : Connection reset by peer"
)
NCCL_1514 = (
    "DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1275, internal error, "
    "NCCL version 2.14.3\nncclInternalError: Internal check failed.\nLast error:\n"
    "Net : Connection closed by remote peer user<50260>"
)
NCCL_WARNS = {
    "socketProgress: Connection closed by remote peer 10.10.1.3<36138>": "10.10.1.3",
    "Net : Call to recv from 10.200.84.247<58355> failed : Broken pipe": "10.200.84.247",
    "NET/IB : Got completion from peer 11.214.147.122<39138> with error 12, opcode 0, len 0, vendor err 129": "11.214.147.122",
    "socketProgress: Connection closed by remote peer gpu004.ds-a4-r02.abc.com<55693>": "gpu004.ds-a4-r02.abc.com",
    "socketProgress: Connection closed by remote peer node2<42830>": "node2",
}


def test_failure_line_keeps_the_line_naming_the_lost_peer() -> None:
    from launcher.config.health import failure_line, peer_address

    line = failure_line(NCCL_1514)
    assert line.startswith(
        "DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp"
    )
    assert line.endswith(" | Net : Connection closed by remote peer user<50260>") and "\n" not in line
    assert peer_address(line) == "user"
    assert failure_line(NCCL_2076).endswith(
        "| socketProgressOpt: Call to recv from 172....<33759> failed : Connection reset by peer"
    )
    gloo = GLOO_KILL_RANK1[0][2]
    assert failure_line(gloo) == gloo[:300] and peer_address(gloo) == "127.0.0.11"
    assert failure_line("ValueError: bad\nmore") == "ValueError: bad"  # no peer: the first line only
    for text, addr in NCCL_WARNS.items():
        assert peer_address(text) == addr, text
    assert peer_address("RuntimeError: injected bug at step 3") is None


def test_peer_named_in_gloo_errors_is_blamed_not_the_cascade() -> None:
    """The real gloo texts: rank 2 names 127.0.0.11 = node2 (the victim's);
    rank 0's 127.0.0.1 is no node's; rank 3's 127.0.0.10 is node1, whose
    only rank raised itself (alive). node2 is blamed, with the evidence."""
    from launcher.selfheal.attribution import PEER_ERROR, first_cause, peer_fault

    assert all(PEER_ERROR.search(e) for _, _, e in GLOO_KILL_RANK1)
    rank_node = {r: f"node{r + 1}" for r in range(4)}
    addresses = {f"node{r + 1}": {f"node{r + 1}", f"127.0.0.{10 + r}"} for r in range(4)}
    f = peer_fault(GLOO_KILL_RANK1, rank_node, addresses)
    assert f is not None and f["cause"] == "peer" and f["node"] == "node2"
    assert f["error"] == "rank 2 lost its peer 127.0.0.11 (node2) in a collective"
    assert f["evidence"]["first_rank"] == 2 and f["evidence"]["alive"] == ["node1", "node3", "node4"]
    assert [(n["rank"], n["address"], n["nodes"]) for n in f["evidence"]["named"]] == [
        (2, "127.0.0.11", ["node2"]),
        (0, "127.0.0.1", []),
        (3, "127.0.0.10", ["node1"]),
    ]
    # Rank 2's error lost: the cascade's node1 is alive, 127.0.0.1 no node's: nobody.
    assert peer_fault(GLOO_KILL_RANK1[1:], rank_node, addresses) is None
    # All nodes at one address (the test cluster's NodeAddr=127.0.0.1): ambiguous, nobody.
    same = {f"node{r + 1}": {f"node{r + 1}", "127.0.0.11", "127.0.0.10"} for r in range(4)}
    assert peer_fault(GLOO_KILL_RANK1, rank_node, same) is None
    # A rank's own error beside the connection errors is better evidence.
    bug = [*GLOO_KILL_RANK1, (0.001, 1, "RuntimeError: injected bug at step 3")]
    assert peer_fault(bug, rank_node, addresses) is None
    assert first_cause(sorted(bug))[1] == 1 and first_cause(GLOO_KILL_RANK1)[1] == 2


def test_peer_named_in_nccl_errors_maps_host_names_and_addresses() -> None:
    """NCCL's HOST<PORT> (a FQDN whose first label is the Slurm node, or an
    IP that is a node's NodeAddr), as failure_line records it."""
    from launcher.config.health import failure_line
    from launcher.selfheal.attribution import nodes_at, peer_fault

    addresses = {"gpu003": {"gpu003", "10.10.1.2"}, "gpu004": {"gpu004", "10.10.1.3"}}
    assert nodes_at("gpu004.ds-a4-r02.abc.com", addresses) == ["gpu004"]
    assert nodes_at("10.10.1.3", addresses) == ["gpu004"] and nodes_at("10.10.1", addresses) == []
    head = NCCL_2076.split("Last error:")[0] + "Last error:\n"
    for warn in (
        "socketProgress: Connection closed by remote peer gpu004.ds-a4-r02.abc.com<55693>",
        "socketProgress: Connection closed by remote peer 10.10.1.3<36138>",
    ):
        errors = [(5.0, 0, failure_line(head + warn))]
        f = peer_fault(errors, {0: "gpu003", 1: "gpu003", 2: "gpu004", 3: "gpu004"}, addresses)
        assert f is not None and f["node"] == "gpu004", warn


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


def test_burn_ins_put_a_node_on_probation_then_clear_its_faults() -> None:
    """A node's faults stop counting only at a clearing burn-in line (the
    pass that completed launcher.burnin_passes in a row); before it, passes
    since its newest fault are probation; a failed one starts over; a fault
    after the clearing counts again."""
    now = time.time()
    recs = [
        {"node": "a", "cause": "signal", "run": "r1", "time": now - 50},
        {"node": "a", "cause": "hang", "run": "r2", "time": now - 40},
        {"node": "a", "burnin": "pass", "run": "r2", "time": now - 30},
    ]
    assert list(nodeledger.bad_nodes(recs, 2, 1.0, now)) == ["a"]  # a pass is not a fault, nor a clear
    assert nodeledger.standing(recs)["a"] == {"state": "probation", "passes": 1, "at": now - 30}
    failed = [*recs, {"node": "a", "burnin": "fail", "run": "r2", "time": now - 25}]
    assert nodeledger.standing(failed)["a"]["state"] == "failed"
    assert nodeledger.standing(failed)["a"]["passes"] == 0
    cleared = [*failed, {"node": "a", "burnin": "pass", "run": "r2", "cleared": True, "time": now - 20}]
    assert nodeledger.bad_nodes(cleared, 1, 1.0, now) == {}
    assert nodeledger.standing(cleared)["a"]["state"] == "cleared"
    again = [*cleared, {"node": "a", "cause": "signal", "run": "r3", "time": now - 10}]
    assert [r["run"] for r in nodeledger.bad_nodes(again, 1, 1.0, now)["a"]] == ["r3"]
    assert nodeledger.standing(again)["a"] == {"state": "probation", "passes": 0, "at": now - 20}


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


def test_burn_in_commands_come_from_the_supervised_srun_line() -> None:
    from launcher.selfheal.growback import task_prefix

    srun = [
        "srun",
        "--unbuffered",
        "--container-image=x",
        "/usr/bin/python3",
        "-u",
        "-m",
        "train.loop.signals",
        "/r",
    ]
    assert task_prefix(srun) == (["srun", "--unbuffered", "--container-image=x"], "/usr/bin/python3")
    with pytest.raises(AssertionError):
        task_prefix(["srun", "python", "train.py"])


def test_shrink_or_requeue_prices_both_and_requeues_only_when_cheaper_and_no_later() -> None:
    """1,000 steps left at 0.1 s, dp 4 -> 2 (0.2 s shrunk), a 5 s restart."""
    from launcher.selfheal.shrinkchoice import choose

    args = dict(remaining_steps=1000, step_s=0.1, dp_planned=4, dp_shrunk=2, restart_s=5.0)
    # The lost node still held (idle): 200 s on 16 GPUs against 105 s on 16, no queue.
    c = choose(**args, wait_s=0.0, held_gpus=16, full_gpus=16)
    assert c.requeue and c.figures["stay"] == {"finish_s": 200.0, "gpu_s": 3200.0, "gpus": 16}
    assert c.figures["requeue"] == {"finish_s": 105.0, "gpu_s": 1680.0, "gpus": 16}, c.figures
    assert c.why.startswith("a requeue is cheaper and no later: ") and "queue wait 0 s" in c.why
    # Cheaper, but a 300 s queue wait finishes later: stay.
    c = choose(**args, wait_s=300.0, held_gpus=16, full_gpus=16)
    assert not c.requeue and c.figures["requeue"]["finish_s"] == 405.0
    # The lost node gone from the allocation: 8 GPUs for 200 s cost less than 16 for 105 s.
    c = choose(**args, wait_s=0.0, held_gpus=8, full_gpus=16)
    assert not c.requeue and c.why.startswith("staying shrunk: ")
    # Nothing to price: stay, and say why.
    assert "no step time" in choose(**{**args, "step_s": None}, wait_s=0.0, held_gpus=16, full_gpus=16).why
    assert "no start estimate" in choose(**args, wait_s=None, held_gpus=16, full_gpus=16).why


def test_a_real_exit_code_under_the_others_stop_codes_is_a_failure() -> None:
    """srun exits with its tasks' highest code: rank 0's 1 and the others' 75
    (their stop after srun's SIGTERM) make 75. The supervisor tells a
    failure from a stop by srun's lines (seen with Accelerate's test_script)."""
    from launcher.selfheal.attribution import failed_exit_line

    lines = [
        (1.0, "srun: error: node2: task 0: Exited with exit code 1"),
        (1.1, "srun: error: node2: task 1: Exited with exit code 75"),
        (1.1, "srun: error: node3: task 3: Exited with exit code 75"),
    ]
    assert failed_exit_line(lines, (75, 76)) == lines[0][1]
    assert failed_exit_line(lines[1:], (75, 76)) is None  # every task stopped: a stop
    assert failed_exit_line([(1.0, "srun: error: node2: task 0: Killed")], (75, 76)) is None


def test_tasks_that_all_stopped_for_requeue_are_a_stop_whatever_srun_exits() -> None:
    """Slurm's --signal=USR2@lead (the time limit's) reaches the job's steps,
    never the batch shell: the supervisor is not told. One program that had
    to be killed at the window's end (76), srun's SIGTERM of the rest, srun
    exit 143: a stop to requeue, not a fault on the first node (Lightning's
    transformer example on the test cluster was blamed, shrunk and failed)."""
    from launcher.selfheal.attribution import stop_exit_code

    lines = [
        (1.0, "srun: error: node1: task 1: Exited with exit code 76"),
        (1.1, "srun: launch/slurm: _step_signal: Terminating StepId=22.1"),
        (1.2, "srun: error: node3: task 3: Exited with exit code 75"),
        (1.2, "srun: error: node3: task 2: Terminated"),
    ]
    assert stop_exit_code(lines, (75, 76)) == 76
    assert stop_exit_code(lines[2:], (75, 76)) == 75
    assert (
        stop_exit_code([*lines, (1.3, "srun: error: node1: task 0: Exited with exit code 1")], (75, 76))
        is None
    )
    assert stop_exit_code([*lines, (1.3, "srun: error: node1: task 0: Killed")], (75, 76)) is None
    assert stop_exit_code([(1.0, "srun: error: node2: task 0: Terminated")], (75, 76)) is None


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
