"""Tiered checkpoints: async DCP saves to node-local storage (tier 1), a
verified background copy to a shared filesystem (tier 2) and S3 (tier 3),
retention per tier, and resume from the newest complete, verified copy at
any world size. The interface is the contract in docs/CONTRACTS.md.

Modules: ``manager`` (CheckpointManager, put together from ``wiring``:
groups, directory and node leaders, stores, the worker; ``saving``: the
save path; ``resume``: the resume path), ``manifest`` (commit record,
checksums), ``store`` (the store interface, shared-FS store), ``s3`` (S3
store), ``upload`` (per-node upload protocol), ``retention``, ``tiers``
(paths, a run's stores). The deterministic test/benchmark loop lives in
scripts/ckpt_drill.py; ``worker`` is the per-rank process that writes,
commits and uploads, ``staging`` the shared CPU buffers the trainer copies
its state into for it. Importing this package
imports torch; ``launcher`` never imports it.
"""

from __future__ import annotations

import os
from pathlib import Path

from train.checkpoint.manager import CheckpointManager
from train.checkpoint.manifest import list_steps, step_dir_name

__all__ = ["CheckpointManager", "complete_checkpoints"]


def complete_checkpoints(root: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """(step, dir) of every checkpoint with a manifest, oldest first."""
    return [(s, Path(root) / step_dir_name(s)) for s in list_steps(root)]
