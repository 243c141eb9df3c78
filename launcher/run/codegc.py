"""``meshrun snapshot --gc``: remove this user's code store entries
(launcher/run/codestore.py) that no live run uses. A submission never
removes an entry another one may use; this is the store's only cleaner.

An entry is kept when a run record under the runs root names it
(``code.dir``, ``code.project.dir``) and that run is live: its Slurm job is
still queued or running (``squeue``), or it was submitted within
``keep_days``; when Slurm cannot be asked, every named entry is kept. An
entry made or reused within ``keep_days`` is kept too (a run whose run dir
is outside the runs root), and so is one a submission holds right now.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from launcher.config.runfiles import JOB_FILE, RECORD_FILE
from launcher.run import codestore
from launcher.run.codewalk import STORE_DIR

JOB_FILE = Path("slurm") / JOB_FILE


def active_jobs() -> set[str] | None:
    """This user's queued or running Slurm job ids; None when Slurm cannot be asked."""
    if shutil.which("squeue") is None:
        return None
    try:
        p = subprocess.run(
            ["squeue", "-h", "-u", str(os.getuid()), "-o", "%i"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if p.returncode:
        return None
    return {line.split("_")[0].strip() for line in p.stdout.splitlines() if line.strip()}


def _records(runs_root: Path) -> list[Path]:
    """Every run record under the runs root (a run dir's own folders are not walked)."""
    out: list[Path] = []
    for dirpath, dirnames, names in os.walk(runs_root):
        if RECORD_FILE in names:
            out.append(Path(dirpath) / RECORD_FILE)
            dirnames[:] = []
            continue
        dirnames[:] = [d for d in dirnames if d != STORE_DIR]
    return out


def _named(rec: dict[str, Any]) -> list[str]:
    code = rec.get("code") or {}
    dirs = [code.get("dir"), (code.get("project") or {}).get("dir")]
    return [str(Path(d).parent) for d in dirs if isinstance(d, str) and d]


def live_entries(runs_root: Path, keep_s: float, jobs: set[str] | None) -> dict[str, str]:
    """Entry path -> the live run that names it."""
    now = time.time()
    out: dict[str, str] = {}
    for path in _records(runs_root):
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        run_dir = path.parent
        try:
            job = str(json.loads((run_dir / JOB_FILE).read_text()).get("job_id"))
        except (OSError, ValueError, AttributeError):
            job = ""
        recent = now - float(rec.get("submitted_at") or 0) < keep_s
        if jobs is None or recent or (job and job in jobs):
            for entry in _named(rec):
                out.setdefault(entry, str(run_dir))
    return out


def _last_use(entry: Path) -> float:
    times = [entry.stat().st_mtime]
    mark = entry.parent / codestore.USED_DIR / entry.name
    if mark.exists():
        times.append(mark.stat().st_mtime)
    return max(times)


def _held_by_another(entry: Path) -> bool:
    try:
        fd = os.open(entry / codestore.LOCK_FILE, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def gc(runs_root: Path, keep_days: float) -> tuple[list[str], list[str]]:
    """(removed, kept with why) among this user's entries under ``runs_root``."""
    udir = codestore.user_store(runs_root.resolve() / STORE_DIR)
    if not udir.is_dir():
        return [], []
    keep_s = keep_days * 86400
    jobs = active_jobs()
    live = live_entries(runs_root.resolve(), keep_s, jobs)
    removed: list[str] = []
    kept: list[str] = []
    for entry in sorted(p for p in udir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if str(entry) in live:
            kept.append(f"{entry} (used by {live[str(entry)]})")
        elif time.time() - _last_use(entry) < keep_s:
            kept.append(f"{entry} (made or used within {keep_days:g} days)")
        elif _held_by_another(entry):
            kept.append(f"{entry} (a submission is using it)")
        else:
            codestore.discard(entry)
            (udir / codestore.USED_DIR / entry.name).unlink(missing_ok=True)
            removed.append(str(entry))
    for tmp in udir.glob(".t*-*"):  # a killed submission's half-made entry or trash
        if time.time() - tmp.stat().st_mtime > 3600:
            codestore.discard(tmp) if tmp.name.startswith(".tmp-") else shutil.rmtree(tmp, ignore_errors=True)
    return removed, kept
