"""Units of self-healing without Slurm: the bad-node ledger (concurrent
writers, threshold, window, retraction), the shrink decision (which layouts
run on fewer nodes, which cannot) and the attempt's plan file, the fault summary status and
Prometheus show, the hang limits' defaults, `meshrun nodes`, and refusals
of the new fields. The cluster scenarios are tests/cluster/test_selfheal.py.

Here: its tests that start no process, no process group and no server
(tier unit); the rest: tests/local/test_selfheal_units.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from launcher.config import nodeledger
from launcher.config.health import fault_summary, read_faults


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
