"""A failed attempt's fault, from its evidence: :func:`attribute` is a pure
function of an :class:`Evidence` (what srun printed, the ranks' recorded
errors and heartbeats, Slurm's node states and addresses, the job kind),
gathered by launcher/selfheal/evidence.py; nothing here asks Slurm or reads
a file, so every rule is unit-testable.

The order (docs/self-healing.md): a hang's unresponsive node; a node Slurm
reports down or removed from the job; a job=script wrapper's own failure
before its program started (cause ``wrapper``: the run's error, no node
blamed); then rank causes: the first real
Python error's node (none when ranks on two or more nodes raised it), a
task SIGKILLed or OOM-killed, the peer a collective's connection error
names (cause ``peer``), a task SIGABRTed; else srun's first error line."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any

from launcher.config.health import STEP_PHASES, peer_address
from launcher.config.scriptjob import is_wrapper_error

SRUN_ERROR = re.compile(r"srun: error: (\S+): tasks? ([0-9,\-]+): (.+)")
# A rank's error that only says a peer went away (the cause is elsewhere).
PEER_ERROR = re.compile(
    r"closed by (remote )?peer|Connection reset|remote worker|Broken pipe|NCCL.*remote|remote process exited"
    r"|completion from peer",
    re.I,
)
# srun's words for a task ended by a signal that says little of its own node:
# SIGABRT is what a survivor's NCCL watchdog does seconds after a peer's real
# error (TORCH_NCCL_ASYNC_ERROR_HANDLING); SIGTERM is srun's own kill of the
# rest (--kill-on-bad-exit). SIGKILL (the OOM killer, an admin), an OOM kill
# or SIGSEGV/SIGBUS are the task's own end: strong.
WEAK_SIGNALS = ("Aborted",)
# srun's words for a task that died of meshrun's own stop signal before its
# handler was set (the interpreter's start, before a job=script wrapper's
# first line): a stop that came early, never a node's fault; a stop whose
# work was not saved (76).
STOP_SIGNAL_DEATH = "User defined signal 2"
NOT_SIGNALS = ("Exited with exit code", "Terminated", STOP_SIGNAL_DEATH)  # srun's SIGTERM: never the cause
# A script job's fault step: the furthest any rank reached, "done" ranks too
# (a team's program may report steps on rank 0 only).
REACHED_PHASES = (*STEP_PHASES, "done")


@dataclass(frozen=True)
class Evidence:
    """What is known of a failed attempt when it is attributed."""

    job: str  # SLURM_JOB_ID
    attempt: str  # the attempt's tag
    nodes: list[str]  # the attempt's nodes
    srun_exit: int
    started_at: float
    job_kind: str  # job.kind: a script job's step counts "done" ranks too
    now: float  # the fault's time when nothing else dates it
    heartbeats: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> this attempt's last beat
    srun_errors: list[tuple[float, str]] = field(default_factory=list)  # srun's error lines, (time, line)
    errors: list[tuple[float, int, str]] = field(
        default_factory=list
    )  # the ranks' (time, rank, error), oldest first
    down: dict[str, str] = field(
        default_factory=dict
    )  # node -> Slurm's bad state, or its removal from the job
    addresses: dict[str, set[str]] = field(
        default_factory=dict
    )  # node -> its names and addresses (peer errors)
    hang: dict[str, Any] | None = None  # launcher/selfheal/hangend.py's record of a hang


def real_errors(errors: list[tuple[float, int, str]]) -> list[tuple[float, int, str]]:
    """The recorded Python errors that are not a lost peer's connection error."""
    return [e for e in errors if not PEER_ERROR.search(e[2])]


def signalled_lines(srun_errors: list[tuple[float, str]]) -> tuple[list[tuple[float, str]], ...]:
    """srun's (time, line)s of tasks killed by a signal: (strong, weak)."""
    sig = [
        (t, line)
        for t, line in srun_errors
        if (m := SRUN_ERROR.search(line)) and not m.group(3).startswith(NOT_SIGNALS)
    ]
    weak = [x for x in sig if SRUN_ERROR.search(x[1]).group(3).startswith(WEAK_SIGNALS)]  # type: ignore[union-attr]
    return [x for x in sig if x not in weak], weak


def failed_exit_line(srun_errors: list[tuple[float, str]], stop_codes: tuple[int, ...]) -> str | None:
    """srun's first line of a task that exited with a code other than 0 or a
    stop code. srun's own exit is its tasks' highest code: one task's real
    failure (1) and the others' stop after srun's SIGTERM (75) make 75,
    which alone reads as a requeue; this line says it was a failure."""
    for _, line in srun_errors:
        m = SRUN_ERROR.search(line)
        code = re.search(r"Exited with exit code (\d+)", m.group(3)) if m else None
        if code and int(code.group(1)) not in (0, *stop_codes):
            return line
    return None


def stop_exit_code(srun_errors: list[tuple[float, str]], stop_codes: tuple[int, ...]) -> int | None:
    """The highest stop code when every task that srun names exited with
    one (none failed, none was killed): the tasks stopped for a signal the
    batch shell never got. Slurm's ``--signal=USR2@lead`` (the time limit's)
    reaches the job's steps only, and srun itself may then exit 143 after
    it ended the other tasks; that is a stop, not a fault. None otherwise."""
    codes = []
    for _, line in srun_errors:
        m = SRUN_ERROR.search(line)
        if not m:
            continue
        if m.group(3).startswith(STOP_SIGNAL_DEATH):
            codes.append(max(stop_codes))
            continue
        code = re.search(r"Exited with exit code (\d+)", m.group(3))
        if code is None:
            if re.search(r"Killed|Segmentation|Aborted|Bus error|out of memory|oom", m.group(3), re.I):
                return None
            continue  # srun's own SIGTERM of the rest: Terminated
        if int(code.group(1)) not in stop_codes:
            return None
        codes.append(int(code.group(1)))
    return max(codes) if codes else None


def signalled_line(
    srun_errors: list[tuple[float, str]], errors: list[tuple[float, int, str]], *, weak: bool = False
) -> tuple[float, str] | None:
    """srun's first (time, line) of a task killed by a signal when that is
    the cause. Rank causes, in order: the earliest real Python error (any
    error but a lost peer's: then None here), a task SIGKILLed / OOM-killed
    (or SIGSEGV), then, with ``weak``, one SIGABRTed (so a survivor's
    watchdog abort within seconds of another rank's real error is never
    blamed); a SIGTERMed task never is (srun's own kill of the rest)."""
    if real_errors(errors):
        return None
    strong, weak_ = signalled_lines(srun_errors)
    if strong:
        return strong[0]
    return weak_[0] if weak and weak_ else None


def first_cause(errors: list[tuple[float, int, str]]) -> tuple[float, int, str]:
    """The first (time, rank, error) that is not a lost peer's connection
    error; the first of all when every one is."""
    return next(iter(real_errors(errors)), errors[0])


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def nodes_at(addr: str, addresses: dict[str, set[str]]) -> list[str]:
    """The nodes whose names or addresses (node -> its node name, NodeAddr,
    NodeHostName, their IPs) include ``addr``; a host name also matches by
    its first label (NCCL may print ``gpu004.cluster.example`` for gpu004)."""
    short = addr if _is_ip(addr) else addr.split(".")[0]
    return sorted(n for n, names in addresses.items() if addr in names or short in names)


def named_peers(errors: list[tuple[float, int, str]]) -> list[tuple[float, int, str, str]]:
    """(time, rank, error, address) of each connection error that names its peer."""
    return [(t, r, e, a) for t, r, e in errors if PEER_ERROR.search(e) and (a := peer_address(e))]


def peer_fault(
    errors: list[tuple[float, int, str]],
    rank_node: dict[int, str],
    addresses: dict[str, set[str]],
) -> dict[str, Any] | None:
    """The node a collective's connection error names, when every recorded
    error is such an error (a rank's own error is better evidence): the first
    error, in time, whose address is one node's only, skipping nodes all of
    whose ranks recorded an error themselves (they were alive to raise: a
    cascade, not the cause). None when no error names such a node."""
    if not errors or any(not PEER_ERROR.search(e) for _, _, e in errors):
        return None
    raised = {r for _, r, _ in errors}
    alive = {n for n in set(rank_node.values()) if all(r in raised for r, m in rank_node.items() if m == n)}
    named = [
        {"rank": r, "at": t, "address": a, "nodes": nodes_at(a, addresses), "error": e}
        for t, r, e, a in named_peers(errors)
    ]
    for n in named:
        if len(n["nodes"]) == 1 and n["nodes"][0] not in alive:
            node = n["nodes"][0]
            return {
                "cause": "peer",
                "node": node,
                "error": f"rank {n['rank']} lost its peer {n['address']} ({node}) in a collective",
                "fault_at": n["at"],
                "evidence": {
                    "first_rank": n["rank"],
                    "error": n["error"],
                    "named": named,
                    "alive": sorted(alive),
                },
            }
    return None


def attribute(ev: Evidence) -> dict[str, Any]:
    """The fault record of a failed attempt: cause, node (None: none
    blamed), error, step, evidence, fault_at."""
    reached = REACHED_PHASES if ev.job_kind == "script" else STEP_PHASES
    steps = [int(h["step"]) for h in ev.heartbeats.values() if h.get("phase") in reached]
    fault: dict[str, Any] = {
        "job": ev.job,
        "attempt": ev.attempt,
        "nodes": ev.nodes,
        "srun_exit": ev.srun_exit,
        "started_at": ev.started_at,
        "step": max(steps) if steps else 0,
    }
    fault.update(_cause(ev, fault["step"]))
    fault.setdefault("fault_at", ev.srun_errors[0][0] if ev.srun_errors else ev.now)
    return fault


def _cause(ev: Evidence, step: int) -> dict[str, Any]:
    """The first rule that holds, in the order of the module's docstring."""
    if ev.hang:
        return _hang_fault(ev.hang)
    if ev.down:
        node = sorted(ev.down)[0]
        return {
            "cause": "node_down",
            "node": node,
            "error": f"Slurm: {node} {ev.down[node]}",
            "evidence": {"states": ev.down},
        }
    first_srun = ev.srun_errors[0][1] if ev.srun_errors else ""
    if wrapped := [e for e in ev.errors if is_wrapper_error(e[2])]:
        return _wrapper_fault(wrapped, first_srun)
    hbs = ev.heartbeats
    # Rank causes: a real Python error > SIGKILL/OOM > the peer a connection error names > SIGABRT.
    sig = signalled_line(ev.srun_errors, ev.errors)
    if (
        sig is None
        and ev.errors
        and (peer := peer_fault(ev.errors, _rank_nodes(hbs), ev.addresses)) is not None
    ):
        peer["step"] = int(hbs.get(peer["evidence"]["first_rank"], {}).get("step", step))
        peer["evidence"]["srun"] = first_srun
        return peer
    if sig is not None or (sig := signalled_line(ev.srun_errors, ev.errors, weak=True)) is not None:
        node, tasks, what = SRUN_ERROR.search(sig[1]).groups()  # type: ignore[union-attr]
        return {
            "cause": "signal",
            "node": node,
            "error": f"task {tasks}: {what}",
            "evidence": {"srun": sig[1]},
        }
    if ev.errors:
        return _error_fault(ev, step, first_srun)
    m = SRUN_ERROR.search(first_srun)
    return {
        "cause": "exit",
        "node": m.group(1) if m else None,
        "error": m.group(3) if m else f"srun exit {ev.srun_exit}",
        "evidence": {"srun": first_srun},
    }


def _rank_nodes(hbs: dict[int, dict[str, Any]]) -> dict[int, str]:
    return {r: str(h["node"]) for r, h in hbs.items() if h.get("node")}


def _hang_fault(hang: dict[str, Any]) -> dict[str, Any]:
    """A hang: blamed on the one node whose ranks wrote no stack, else none."""
    nodes, stale = hang["unresponsive_nodes"], hang["stale"]
    evidence = dict(hang)  # a copy: the attempt's own record stays as hangend wrote it
    if len(nodes) > 1:
        evidence["note"] = "several nodes did not answer: none blamed"
    return {
        "cause": "hang",
        "node": nodes[0] if len(nodes) == 1 else None,
        "error": f"no progress for {max(s['silent_s'] for s in stale.values())} s in phase "
        f"{sorted({s['phase'] for s in stale.values()})}",
        "step": max(s["step"] for s in stale.values()),
        "fault_at": min(s["last_beat_at"] for s in stale.values()),  # progress stopped
        "evidence": evidence,
    }


def _wrapper_fault(wrapped: list[tuple[float, int, str]], first_srun: str) -> dict[str, Any]:
    """A job=script wrapper failed before its program started (a bad spec, a
    workdir copy that failed, an interpreter that cannot start): the run's
    error, not its node's (srun names a node only because the task ran there)."""
    t, rank, err = wrapped[0]
    return {
        "cause": "wrapper",
        "node": None,
        "error": err,
        "evidence": {"first_rank": rank, "ranks": sorted({r for _, r, _ in wrapped}), "srun": first_srun},
        "fault_at": t,
    }


def _error_fault(ev: Evidence, step: int, first_srun: str) -> dict[str, Any]:
    """The first real Python error's rank and node; no node when ranks on
    two or more nodes raised the same error (the code's, not a node's)."""
    t, rank, err = first_cause(ev.errors)
    hbs = ev.heartbeats
    same = {hbs.get(r, {}).get("node") for _, r, e in ev.errors if e == err}
    everywhere = len(same - {None}) > 1
    return {
        "cause": "error",
        "node": None if everywhere else hbs.get(rank, {}).get("node"),
        "error": err,
        "step": int(hbs.get(rank, {}).get("step", step)),
        "evidence": {
            "first_rank": rank,
            "ranks_with_this_error": sorted(r for _, r, e in ev.errors if e == err),
            "nodes_with_this_error": sorted(n for n in same if n),
            "srun": first_srun,
        },
        "fault_at": t,
    }
