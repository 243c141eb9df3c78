"""Undo what a failed submission wrote into a run directory.

Submitit needs the run dir on disk before ``sbatch`` runs (the script and the
logs live in ``<run_dir>/slurm``), so a submission writes first and learns
afterwards whether Slurm accepted it. :class:`RunDirUndo` remembers what was
there before; :meth:`RunDirUndo.undo` removes every file and directory that
was added since (the run dir itself and the parents created for it included)
and puts back the previous content of files that were overwritten (a resumed
run's ``config.yaml``, ``spec.json``, ...). Nothing outside the run dir is
touched, and a parent is removed only when it is empty.
"""

from __future__ import annotations

import os
from pathlib import Path


class RunDirUndo:
    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)
        # The highest directory that does not exist yet: created for this run.
        self.top: Path | None = None
        p = self.run_dir
        while not p.exists() and p != p.parent:
            self.top, p = p, p.parent
        self.existed = self.run_dir.is_dir()
        self.before: dict[Path, bytes | None] = {}  # file -> content (None: a directory)
        if self.existed:
            for root, dirs, files in os.walk(self.run_dir):
                for d in dirs:
                    self.before[Path(root) / d] = None
                for f in files:
                    path = Path(root) / f
                    try:
                        # Only small launcher files get overwritten; keep the
                        # rest by identity (a checkpoint is never rewritten).
                        self.before[path] = path.read_bytes() if path.stat().st_size < 1 << 20 else b""
                    except OSError:
                        self.before[path] = b""

    def undo(self) -> str:
        """Remove what was added, restore what was overwritten; says what it did."""
        if not self.existed:
            self._remove_new_tree()
            return f"removed {self.run_dir}"
        for root, dirs, files in os.walk(self.run_dir, topdown=False):
            for f in files:
                path = Path(root) / f
                if path not in self.before:
                    path.unlink(missing_ok=True)
                elif self.before[path]:
                    path.write_bytes(self.before[path] or b"")
            for d in dirs:
                path = Path(root) / d
                if path not in self.before:
                    _rmdir_if_empty(path)
        return f"restored {self.run_dir} as it was"

    def _remove_new_tree(self) -> None:
        if self.run_dir.is_dir():
            for root, dirs, files in os.walk(self.run_dir, topdown=False):
                for f in files:
                    (Path(root) / f).unlink(missing_ok=True)
                for d in dirs:
                    _rmdir_if_empty(Path(root) / d)
            _rmdir_if_empty(self.run_dir)
        # Parents made for this run, up to the first that existed before.
        p = self.run_dir.parent
        while self.top is not None and p != self.top.parent and _rmdir_if_empty(p):
            p = p.parent


def _rmdir_if_empty(path: Path) -> bool:
    try:
        path.rmdir()
        return True
    except OSError:
        return False
