"""Where each tier lives for a run."""

from __future__ import annotations

import os
from typing import Any

from launcher.runid import read_run_id


def run_name(spec: Any) -> str:
    """The run's name in shared places (a node's NVMe, Lustre, S3 prefixes):
    its run id (launcher/runid.py), unique per run and kept in the run
    directory, so reusing a run directory resumes and nothing else does."""
    run_id = getattr(spec, "run_id", "") or read_run_id(spec.run_dir)
    if not run_id:
        # Every spec the launcher writes has one (save_spec).
        raise ValueError(f"run dir {spec.run_dir} has no run id; start it with python -m launcher")
    return run_id


def local_root(spec: Any) -> str:
    """Tier 1. ``storage.local_dir`` is shared by every run on a node, so the
    run gets its own subdirectory (retention must never see another run)."""
    local_dir = spec.cfg.storage.local_dir
    if not local_dir:
        return os.path.join(spec.run_dir, "checkpoints")
    return os.path.join(local_dir, run_name(spec))
