"""Run identity: every run gets one id at its first start, kept in its run
directory, and every place the run shares with others (node-local checkpoint
root, shared tier, S3 prefix, metric labels, and the Slurm job name unless
launcher.job_name is set) is named by it.

The id is readable and unique: ``<name>-<UTC time>-<random>``, e.g.
``13b-4node-20261201T052233Z-a7f3``. Reusing a run directory resumes that
run (its ``run_id`` file wins); a new directory never sees another run's
checkpoints, even one started in the same second with the same name.

Standard library only (``train`` reads it too).
"""

from __future__ import annotations

import os
import re
import secrets
import time
from pathlib import Path
from typing import Any

RUN_ID_FILE = "run_id"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def run_name(cfg: Any) -> str:
    """The readable part of a new run's id: ``launcher.job_name`` when set,
    else ``<model>-<cluster>`` (job=script: ``<program>-<cluster>``)."""
    return cfg.launcher.job_name or f"{what_runs(cfg)}-{cfg.cluster.name}"


def what_runs(cfg: Any) -> str:
    """The model's name, or a script job's program (file stem or module)."""
    j = cfg.job
    if getattr(j, "kind", "") == "script" and (j.script or j.module):
        return os.path.splitext(os.path.basename(j.script))[0] if j.script else j.module
    return str(cfg.model.name)


def new_run_id(name: str, now: float | None = None) -> str:
    """``<name>-<YYYYmmddTHHMMSSZ>-<4 hex>``; the name reduced to characters
    that are safe in paths, S3 keys, label values and Slurm job names."""
    slug = _UNSAFE.sub("-", name).strip("-.") or "run"
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    return f"{slug[:48]}-{stamp}-{secrets.token_hex(2)}"


def read_run_id(run_dir: str | os.PathLike[str]) -> str:
    """The run directory's id, or "" when it has none yet."""
    try:
        return (Path(run_dir) / RUN_ID_FILE).read_text().strip()
    except FileNotFoundError:
        return ""


def claim_run_id(run_dir: str | os.PathLike[str], name: str) -> str:
    """The run directory's id, created at its first start. Published with
    link(2): two starts racing on one new directory agree on a single id."""
    existing = read_run_id(run_dir)
    if existing:
        return existing
    path = Path(run_dir) / RUN_ID_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{RUN_ID_FILE}.{os.getpid()}.tmp")
    tmp.write_text(new_run_id(name) + "\n")
    try:
        os.link(tmp, path)  # atomic, and fails if another start won the race
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    return read_run_id(run_dir)
