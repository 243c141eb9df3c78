"""``<run_dir>/run_record.json``: everything needed to repeat a run.

Written by the launcher at submission (launcher/run/record.py: the composed
config, the overrides as typed, the code snapshot's digest and git state,
the container image's digest, the data manifest, the parent runs), then
extended by the job itself: rank 0 of every start (each Slurm attempt,
requeue and restart, or local start) appends what it runs on to
``attempts`` (job id, restart, nodes, interpreter, torch and key package
versions as the job sees them, and the code dir it imported meshrun from).
``meshrun rerun`` and ``meshrun diff`` read it.

Torch-free and small: the trainer imports it (train/jobs/entry.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import platform
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from launcher.config.runfiles import RECORD_FILE

VERSION = 1
# Versions recorded in each attempt (those installed; others are left out).
KEY_PACKAGES = (
    "torch",
    "numpy",
    "triton",
    "nvidia-nccl-cu12",
    "safetensors",
    "xxhash",
    "boto3",
    "submitit",
    "hydra-core",
    "omegaconf",
    "nvidia-dali-cuda120",
    "meshrun",
)


def record_path(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / RECORD_FILE


def read_record(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The run's record; None when it has none (or it is unreadable)."""
    try:
        rec = json.loads(record_path(run_dir).read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


@contextlib.contextmanager
def _locked(run_dir: str | os.PathLike[str]) -> Iterator[None]:
    """One writer at a time (the launcher at a resubmission, each attempt's rank 0)."""
    lock = Path(run_dir) / f".{RECORD_FILE}.lock"
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _write(run_dir: str | os.PathLike[str], rec: dict[str, Any]) -> None:
    path = record_path(run_dir)
    tmp = path.with_name(f".{RECORD_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(rec, indent=1, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)  # atomic: a reader never sees half a record


def write_submission(run_dir: str | os.PathLike[str], rec: dict[str, Any]) -> None:
    """The launcher's part; the attempts a reused run dir already has are kept
    (with the code each ran: ``attempts[i].code_digest``)."""
    with _locked(run_dir):
        old = read_record(run_dir) or {}
        rec = {**rec, "version": VERSION, "attempts": list(old.get("attempts", []))}
        if old.get("code"):
            prev = [*old.get("previous_code", []), {k: old["code"].get(k) for k in ("digest", "mode", "git")}]
            rec["previous_code"] = [{**p, "git": {**(p.get("git") or {}), "diff": None}} for p in prev]
        _write(run_dir, rec)


def package_versions(names: tuple[str, ...] = KEY_PACKAGES) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str] = {}
    for name in names:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            continue
    return out


def attempt_info(world_size: int) -> dict[str, Any]:
    """What this start runs on, as the job itself sees it."""
    env = os.environ
    info: dict[str, Any] = {
        "time": time.time(),
        "host": socket.gethostname(),
        "job_id": env.get("SLURM_JOB_ID") or "local",
        "array_task": env.get("SLURM_ARRAY_TASK_ID"),
        "restart": int(env.get("SLURM_RESTART_COUNT", "0") or 0),
        "attempt": env.get("MESHRUN_ATTEMPT"),
        "nodes": env.get("SLURM_JOB_NODELIST") or socket.gethostname(),
        "world_size": world_size,
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        # Where this process imported meshrun from: the snapshot, or the checkout (live).
        "code_dir": str(Path(__file__).resolve().parents[2]),
        "packages": package_versions(),
    }
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        info["cuda"] = getattr(torch.version, "cuda", None)
        cudnn = getattr(torch.backends, "cudnn", None)
        info["cudnn"] = cudnn.version() if cudnn is not None and cudnn.is_available() else None
    return info


def imported_digest(code_dir: str) -> str | None:
    """The digest of the code store entry this process imported meshrun from
    (``<digest>/snapshot.json`` beside ``code_dir``), not the one the record
    names: a requeue or a late array task that ran other code would show it.
    None for a live checkout (launcher.code=live, a local run)."""
    try:
        meta = json.loads((Path(code_dir).parent / "snapshot.json").read_text())
    except (OSError, ValueError):
        return None
    digest = meta.get("digest") if isinstance(meta, dict) else None
    return digest if isinstance(digest, str) else None


def record_start(run_dir: str | os.PathLike[str], world_size: int) -> dict[str, Any]:
    """Append this start to ``attempts`` (rank 0 of every start)."""
    info = attempt_info(world_size)
    with _locked(run_dir):
        rec = read_record(run_dir) or {"version": VERSION}
        info["code_digest"] = imported_digest(info["code_dir"])
        rec["attempts"] = [*rec.get("attempts", []), info]
        _write(run_dir, rec)
    return info
