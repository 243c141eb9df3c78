"""Checkpoints (first, synchronous version; the interface is the contract in
docs/CONTRACTS.md). Each save is a DCP checkpoint in
``<spec.checkpoint_dir>/step_<N>``; ``manifest.json`` is written last by an
atomic rename, so a directory without one is incomplete and never resumed."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from launcher.spec import RunSpec
from train.dist import DistInfo

MANIFEST = "manifest.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")


def complete_checkpoints(root: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """(step, dir) of every checkpoint with a manifest, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    out = []
    for d in root.iterdir():
        m = _STEP_DIR.match(d.name)
        if m and (d / MANIFEST).is_file():
            out.append((int(m.group(1)), d))
    return sorted(out)


class CheckpointManager:
    def __init__(self, spec: RunSpec, dist_info: DistInfo) -> None:
        self.spec = spec
        self.info = dist_info
        self.root = Path(spec.checkpoint_dir)
        self.every = spec.cfg.storage.save_every_steps
        self.keep = spec.cfg.storage.keep_local
        self.last_saved_step = -1
        self.last_save_s = 0.0

    def resume(self, app_state: dict) -> int:
        found = complete_checkpoints(self.root)
        if not found:
            return 0
        step, path = found[-1]
        dcp.load(app_state, checkpoint_id=str(path))
        self.last_saved_step = step
        return step

    def should_save(self, step: int, *, final: bool = False, preempted: bool = False) -> bool:
        if step == self.last_saved_step:
            return False
        return final or preempted or (self.every > 0 and step % self.every == 0)

    def save(self, step: int, app_state: dict) -> None:
        t0 = time.perf_counter()
        path = self.root / f"step_{step}"
        if self.info.is_main:
            if path.exists():  # a partial save from a crashed attempt
                shutil.rmtree(path)
            path.mkdir(parents=True)
        dist.barrier()
        dcp.save(app_state, checkpoint_id=str(path))
        dist.barrier()  # every rank's shards are on disk before the manifest
        self.last_save_s = time.perf_counter() - t0
        if self.info.is_main:
            manifest = {
                "step": step,
                "world_size": self.info.world_size,
                "config_hash": self.spec.config_hash(),
                "time": time.time(),
                "save_s": self.last_save_s,
            }
            tmp = path / (MANIFEST + ".tmp")
            tmp.write_text(json.dumps(manifest))
            os.replace(tmp, path / MANIFEST)
            self._retain()
        self.last_saved_step = step

    def _retain(self) -> None:
        found = complete_checkpoints(self.root)
        for _, old in found[: max(0, len(found) - self.keep)]:
            shutil.rmtree(old, ignore_errors=True)

    def finalize(self) -> None:
        """Synchronous saves leave nothing pending."""
