"""Which task srun says failed first, and which node a collective's
connection error names, for the supervisor's attribution
(launcher/selfheal/supervisor.py): text work on srun's error lines and the
ranks' recorded errors (``failures.log``); Slurm is asked only for the
nodes' addresses (:func:`peer_fault_of`)."""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from launcher.config.health import peer_address
from launcher.slurm.nodestate import node_addresses

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
NOT_SIGNALS = ("Exited with exit code", "Terminated")  # srun's SIGTERM: never the cause


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


def peer_fault_of(
    errors: list[tuple[float, int, str]], hbs: dict[int, dict[str, Any]], nodes: list[str]
) -> dict[str, Any] | None:
    """:func:`peer_fault` for an attempt on ``nodes``, its ranks' nodes from
    their heartbeats, the nodes' addresses from Slurm (resolved only when an
    error names an address Slurm does not list)."""
    named = named_peers(errors)
    if not named:
        return None
    addresses = node_addresses(nodes, resolve=False)
    if any(not nodes_at(x[3], addresses) for x in named):
        addresses = node_addresses(nodes)
    return peer_fault(errors, {r: str(h["node"]) for r, h in hbs.items() if h.get("node")}, addresses)
