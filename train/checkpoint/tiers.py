"""Where each tier lives for a run."""

from __future__ import annotations

import os
from typing import Any


def run_name(spec: Any) -> str:
    """The run's name in shared places (a node's NVMe, Lustre, S3 prefixes):
    the run directory's basename, so reusing a run directory resumes."""
    return os.path.basename(os.path.normpath(spec.run_dir))


def local_root(spec: Any) -> str:
    """Tier 1. ``storage.local_dir`` is shared by every run on a node, so the
    run gets its own subdirectory (retention must never see another run)."""
    local_dir = spec.cfg.storage.local_dir
    if not local_dir:
        return os.path.join(spec.run_dir, "checkpoints")
    return os.path.join(local_dir, run_name(spec))
