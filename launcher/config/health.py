"""The files a run's ranks and its batch-level supervisor share about health.

Standard library only: the trainer (``train/observe/heartbeat.py``) writes, the
supervisor (``launcher/ops/supervise.py``) reads.

- ``<run_dir>/heartbeats/rank<R>.json``: each rank's progress, rewritten
  atomically (write + rename) at every phase change and at the start of every
  training step: ``{"rank", "node", "pid", "job", "step_id", "attempt",
  "phase", "step", "time"}``; phase is one of :data:`PHASES`; with
  ``"probes": [[step, seconds, after_save], ...]``, the rank's newest solo
  probes (train/observe/probe.py) when it made any.
- ``<run_dir>/stragglers.json``: the supervisor's straggler scores
  (launcher/ops/straggler.py), served to Prometheus by rank 0.
- ``<run_dir>/stacks/<attempt>-rank<R>.txt``: the rank's Python stacks (all
  threads), written by :mod:`faulthandler` when it receives
  :data:`STACK_SIGNAL`. SIGURG: ignored by default (a rank that has not
  registered yet is not killed by it) and unused here otherwise: USR1 is
  NCCL's, USR2 and TERM mean checkpoint-and-stop (train/loop/signals.py).
- ``<run_dir>/faults.jsonl``: one JSON object per failure the supervisor
  saw (cause, node, evidence, what it did).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
from pathlib import Path
from typing import Any

HEARTBEAT_DIR = "heartbeats"
STACKS_DIR = "stacks"
FAULTS_FILE = "faults.jsonl"
STRAGGLERS_FILE = "stragglers.json"
# "warmup": a process's first training step (start-up limit, as startup,
# restore and save); "step": every later one (the step limit).
PHASES = ("startup", "restore", "warmup", "step", "save", "done")
# The phases of a training step (a fault's step, the first resumed step).
STEP_PHASES = ("warmup", "step")
STACK_SIGNAL = signal.SIGURG
# Set by the supervisor for each srun it starts: "<SLURM_RESTART_COUNT>.<n>".
ATTEMPT_ENV = "MESHRUN_ATTEMPT"


# Where a collective's connection error names the peer it lost: gloo's
# "[ADDR]:PORT" ("Connection closed by peer [10.0.0.3]:12345", "Read error
# [10.0.0.3]:12345: Connection reset by peer"), NCCL's "HOST<PORT>" ("Last
# error: socketProgress: Connection closed by remote peer node2<42830>",
# "Call to recv from 10.200.84.247<58355> failed", "Got completion from peer
# 11.214.147.122<39138> with error 12").
PEER_ADDRESS = re.compile(r"\[(?P<gloo>[0-9A-Za-z.:%_-]+)\]:\d+|(?P<nccl>[0-9A-Za-z][\w.:-]*)<\d+>")


def peer_address(error: str) -> str | None:
    """The address or host a connection error names (None when it names none)."""
    m = PEER_ADDRESS.search(error)
    return (m.group("gloo") or m.group("nccl")) if m else None


def failure_line(error: str) -> str:
    """What ``failures.log`` keeps of a rank's error: its first line and, when
    a later line names a lost peer (NCCL's "Last error:" line), that line too."""
    lines = error.splitlines() or [""]
    first = lines[0][:300]
    if peer_address(first) is None:
        peer = next((x.strip() for x in lines[1:] if peer_address(x)), None)
        if peer:
            first += f" | {peer[:200]}"
    return first


def heartbeat_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(run_dir) / HEARTBEAT_DIR / f"rank{rank}.json"


def stack_path(run_dir: str | os.PathLike[str], attempt: str, rank: int) -> Path:
    return Path(run_dir) / STACKS_DIR / f"{attempt}-rank{rank}.txt"


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def write_heartbeat(
    run_dir: str | os.PathLike[str], rank: int, phase: str, step: int, extra: dict[str, Any] | None = None
) -> None:
    """Atomically replace this rank's heartbeat (one small write + rename);
    ``extra``: more fields it carries (the solo probes)."""
    rec = {
        **(extra or {}),
        "rank": rank,
        "node": node_name(),
        "pid": os.getpid(),
        "job": os.environ.get("SLURM_JOB_ID", ""),
        "step_id": os.environ.get("SLURM_STEP_ID", ""),
        "attempt": os.environ.get(ATTEMPT_ENV, ""),
        "phase": phase,
        "step": step,
        "time": time.time(),
    }
    path = heartbeat_path(run_dir, rank)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(rec))
    os.replace(tmp, path)


def read_heartbeats(run_dir: str | os.PathLike[str]) -> dict[int, dict[str, Any]]:
    """rank -> its last heartbeat (unreadable or partial files skipped)."""
    out: dict[int, dict[str, Any]] = {}
    d = Path(run_dir) / HEARTBEAT_DIR
    if not d.is_dir():
        return out
    for p in d.glob("rank*.json"):
        try:
            rec = json.loads(p.read_text())
            out[int(rec["rank"])] = rec
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def append_fault(run_dir: str | os.PathLike[str], rec: dict[str, Any]) -> None:
    """One line of ``<run_dir>/faults.jsonl``."""
    with open(Path(run_dir) / FAULTS_FILE, "a") as f:
        f.write(json.dumps(rec, sort_keys=True, default=str) + "\n")


def read_faults(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    path = Path(run_dir) / FAULTS_FILE
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def fault_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts over ``faults.jsonl``: faults (by cause), restarts inside the
    allocation, requeues, and, per fault the run came back from, seconds from
    the fault to the first resumed step and steps redone."""
    faults = [r for r in records if "cause" in r and "event" not in r]
    resumed = [r for r in records if r.get("event") == "resumed"]
    by_cause: dict[str, int] = {}
    for f in faults:
        by_cause[str(f["cause"])] = by_cause.get(str(f["cause"]), 0) + 1
    return {
        "faults": len(faults),
        "by_cause": by_cause,
        "restarts": sum(1 for f in faults if f.get("action") == "restart"),
        "requeues": sum(1 for f in faults if f.get("action") == "requeue"),
        "seconds_lost": round(sum(float(r.get("seconds_lost", 0)) for r in resumed), 2),
        "steps_redone": sum(int(r.get("steps_redone", 0)) for r in resumed),
        "per_fault": [
            {k: r.get(k) for k in ("cause", "seconds_lost", "detect_s", "steps_redone", "first_step")}
            for r in resumed
        ],
        "last": (
            f"{faults[-1]['cause']} on {faults[-1].get('node') or 'no single node'}: "
            f"{faults[-1].get('error', '')} ({faults[-1].get('action', '')})"
            if faults
            else ""
        ),
    }
