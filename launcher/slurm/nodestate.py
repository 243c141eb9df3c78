"""A node's state as Slurm sees it, and the queries the batch-level
supervisor (:mod:`launcher.ops.supervise`) runs: never raising (a command
that cannot run is a failed CompletedProcess), bounded in time."""

from __future__ import annotations

import re
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


def node_info(node: str) -> dict[str, str]:
    out = slurm_cmd(["scontrol", "-o", "show", "node", node])
    return dict(m.groups() for m in re.finditer(r"(\S+?)=(\S*)", out.stdout))


def node_bad_state(node: str) -> str | None:
    """Slurm's state of ``node`` when it is down, draining or failing; else None."""
    state = node_info(node).get("State", "")
    return state if any(s in state for s in BAD_STATES) else None
