"""Which task srun says failed first, and which node a collective's
connection error names, for the supervisor's attribution
(launcher/ops/supervise.py): text work on srun's error lines and the
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
SIGNAL_RACE_S = 5.0


def signalled_line(
    srun_errors: list[tuple[float, str]], errors: list[tuple[float, int, str]]
) -> tuple[float, str] | None:
    """srun's first (time, line) of a task killed by a signal (not srun's own
    SIGTERM of kill-on-bad-exit), when it is the cause: it came within
    SIGNAL_RACE_S of srun's first error line (a survivor's peer error can win
    that race), or the first Python error (time, rank, error) only says a
    peer went away. A Python error followed by kills after KillWait: None."""
    sig = [
        (t, line)
        for t, line in srun_errors
        if (m := SRUN_ERROR.search(line))
        and not m.group(3).startswith(("Exited with exit code", "Terminated"))
    ]
    if not sig:
        return None
    if not errors or PEER_ERROR.search(errors[0][2]) or sig[0][0] - srun_errors[0][0] <= SIGNAL_RACE_S:
        return sig[0]
    return None


def first_cause(errors: list[tuple[float, int, str]]) -> tuple[float, int, str]:
    """The first (time, rank, error) that is not a lost peer's connection
    error; the first of all when every one is."""
    return next((e for e in errors if not PEER_ERROR.search(e[2])), errors[0])


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
