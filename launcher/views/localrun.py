"""A local run's state, logs and cancel (``meshrun status / logs / cancel``
on a run dir that was never submitted to Slurm).

A local run has no scheduler to ask: it is RUNNING while its launcher holds
the run dir's lock (launcher/run/runlock.py), and otherwise what rank 0
wrote to ``result.json`` says how its last start ended. Its output is the
ranks' ``logs/rank<N>.log`` (launcher/run/local.py); it is cancelled by
signalling the launcher pid the lock records, which stops the ranks the way
Ctrl-C does (they checkpoint first).
"""

from __future__ import annotations

import calendar
import json
import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from launcher.config.health import read_heartbeats
from launcher.config.runfiles import RESULT_FILE
from launcher.config.runid import read_run_id
from launcher.run.runlock import lock_owner, owner_pid

# result.json's status -> the state status and fleet show (Slurm's words).
RESULT_STATES = {"completed": "COMPLETED", "failed": "FAILED", "preempted": "STOPPED"}
STOP_WAIT_S = 60.0  # how long cancel waits for the ranks to checkpoint and exit


@dataclass
class LocalRun:
    state: str  # RUNNING, COMPLETED, FAILED, STOPPED, NOT STARTED
    step: str = "-"  # the newest step a heartbeat or result.json names
    elapsed: str = "-"  # since the running launcher started
    owner: str | None = None  # the lock's owner line while RUNNING

    @property
    def ended(self) -> bool:
        return self.state != "RUNNING"


def is_local(run_dir: str | os.PathLike[str]) -> bool:
    """A run dir a local launcher started: it holds the lock file or rank logs."""
    d = Path(run_dir)
    return (d / "launcher.lock").exists() or (d / "logs").is_dir() or (d / RESULT_FILE).exists()


def local_state(run_dir: str | os.PathLike[str]) -> LocalRun:
    d = Path(run_dir)
    owner = lock_owner(d)
    if owner is not None:
        beats = [h.get("step") for h in read_heartbeats(d).values() if isinstance(h.get("step"), int)]
        return LocalRun("RUNNING", str(max(beats)) if beats else "-", _since(owner), owner)
    try:
        result = json.loads((d / RESULT_FILE).read_text())
    except (OSError, ValueError):
        result = None
    if not isinstance(result, dict):
        # Started (rank logs) but no result: the launcher died before any rank reported.
        return LocalRun("STOPPED" if (d / "logs").is_dir() else "NOT STARTED")
    status = str(result.get("status", ""))
    step = result.get("final_step")
    return LocalRun(
        RESULT_STATES.get(status, status.upper() or "UNKNOWN"),
        str(step) if isinstance(step, int) and step >= 0 else "-",
    )


def _since(owner: str) -> str:
    """Elapsed time since the owner line's ``since <UTC time>``, as sacct prints it."""
    stamp = owner.rsplit("since", 1)[-1].strip()
    try:
        start = calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))  # the stamp is UTC
    except ValueError:
        return "-"
    s = max(0, int(time.time() - start))
    return f"{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}"


def rank_logs(run_dir: str | os.PathLike[str]) -> list[Path]:
    """``logs/rank<N>.log`` in rank order."""
    logs = Path(run_dir) / "logs"
    found = [(p.stem[4:], p) for p in logs.glob("rank*.log")] if logs.is_dir() else []
    return [p for n, p in sorted(found, key=lambda t: int(t[0]) if t[0].isdigit() else 1 << 30)]


def run_label(run_dir: str | os.PathLike[str]) -> str:
    """``<run id> (<run dir>)``: the run's one name, and where it lives."""
    run_id = read_run_id(run_dir)
    return f"{run_id} ({run_dir})" if run_id else str(run_dir)


def cancel_local(run_dir: str | os.PathLike[str], wait_s: float = STOP_WAIT_S) -> tuple[bool, str]:
    """(cancelled, message). Sends SIGTERM to the launcher the lock names
    (it forwards a checkpoint-and-stop to its ranks, as on Ctrl-C) and
    waits up to ``wait_s`` for the lock to be released."""
    label = run_label(run_dir)
    run = local_state(run_dir)
    if run.owner is None:
        at = f" at step {run.step}" if run.step != "-" else ""
        return False, f"nothing to cancel: run {label} is not running ({run.state}{at})"
    found = owner_pid(run.owner)
    if found is None:
        return False, f"cannot cancel run {label}: its lock names no launcher pid ({run.owner!r})"
    pid, host = found
    if host != socket.gethostname():
        return (
            False,
            f"cannot cancel run {label} from here: its launcher (pid {pid}) runs on {host}; cancel it there",
        )
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False, f"nothing to cancel: run {label}'s launcher (pid {pid}) has exited"
    except PermissionError:
        return False, f"cannot cancel run {label}: its launcher (pid {pid}) belongs to another user"
    end = time.monotonic() + wait_s
    while lock_owner(run_dir) is not None:
        if time.monotonic() > end:
            return (
                True,
                f"asked run {label} (launcher pid {pid}) to stop; still stopping after {wait_s:.0f} s",
            )
        time.sleep(0.2)
    return True, (
        f"cancelled run {label} (launcher pid {pid}); the same command with launcher.run_dir={run_dir} "
        "resumes it from its last checkpoint"
    )
