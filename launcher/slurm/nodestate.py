"""A node's state as Slurm sees it, and the queries the batch-level
supervisor (:mod:`launcher.selfheal.supervisor`) runs: never raising (a command
that cannot run is a failed CompletedProcess), bounded in time."""

from __future__ import annotations

import concurrent.futures
import re
import socket
import subprocess

# Node states (substrings of scontrol's State) in which a node is not fit to run a step.
BAD_STATES = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "NO_RESPOND", "POWER")


def slurm_cmd(args: list[str], timeout: float = 20) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return subprocess.CompletedProcess(args, 1, "", str(e))


def hostnames(expr: str) -> list[str]:
    out = slurm_cmd(["scontrol", "show", "hostnames", expr])
    return out.stdout.split() if out.returncode == 0 else []


def _fields(text: str) -> dict[str, str]:
    return dict(m.groups() for m in re.finditer(r"(\S+?)=(\S*)", text))


def node_info(node: str) -> dict[str, str]:
    out = slurm_cmd(["scontrol", "-o", "show", "node", node])
    return _fields(out.stdout)


def job_info(job: str) -> tuple[dict[str, str], str]:
    """``scontrol -o show job``'s fields; ({}, why) when Slurm cannot say."""
    out = slurm_cmd(["scontrol", "-o", "show", "job", job])
    fields = _fields(out.stdout) if out.returncode == 0 else {}
    return fields, "" if fields else (out.stderr or out.stdout).strip()[:200]


def node_bad_state(node: str) -> str | None:
    """Slurm's state of ``node`` when it is down, draining or failing; else None."""
    state = node_info(node).get("State", "")
    return state if any(s in state for s in BAD_STATES) else None


def _ips(name: str) -> set[str]:
    try:
        return {str(ai[4][0]) for ai in socket.getaddrinfo(name, None)}
    except (OSError, UnicodeError):
        return set()


def node_addresses(nodes: list[str], resolve: bool = True, timeout: float = 3.0) -> dict[str, set[str]]:
    """node -> its names and addresses (node name, NodeAddr, NodeHostName;
    with ``resolve``, their IP addresses too, the lookups bounded by
    ``timeout`` seconds in all), to find the node a collective's connection
    error names."""
    out: dict[str, set[str]] = {}
    for node in nodes:
        info = node_info(node)
        out[node] = {node, info.get("NodeAddr", ""), info.get("NodeHostName", "")} - {""}
    if resolve and out:
        names = sorted(set().union(*out.values()))
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(names)))
        futures = {name: pool.submit(_ips, name) for name in names}
        concurrent.futures.wait(futures.values(), timeout=timeout)
        pool.shutdown(wait=False, cancel_futures=True)
        for names_of in out.values():
            for name in list(names_of):
                f = futures[name]
                if f.done() and not f.cancelled():
                    names_of |= f.result()
    return out
