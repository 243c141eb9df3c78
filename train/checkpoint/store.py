"""Remote checkpoint stores: tier 2 (a shared filesystem) and tier 3 (S3,
in :mod:`train.checkpoint.s3`); :func:`train.checkpoint.tiers.build_stores`
makes a run's.

Both hold ``<root>/step_<N>/manifest.json`` and the checkpoint's files under
a generation named by the manifest's digest, ``step_<N>/g<digest16>/<file>``
(see :func:`generation`), plus per-node completion markers
``step_<N>/_nodes/node_<k>.json``. A re-save of a step (a different
checkpoint of the same step, after a resume from an older one) goes to a new
generation: the old copy stays complete until the new manifest replaces the
old one, and only then are the old generation's objects deleted. A store only moves and verifies
bytes; the protocol (markers, manifest last, retention) is in
:mod:`train.checkpoint.upload`.

Credentials for S3 come only from boto3's default chain (environment
variables, ``AWS_PROFILE`` / shared config, instance roles); nothing here
reads, logs or stores them. ``boto3`` is imported where used.
"""

from __future__ import annotations

import logging
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from train.checkpoint.manifest import (
    MANIFEST,
    FileEntry,
    Manifest,
    file_digest,
    parse_step_dir,
    step_dir_name,
)

log = logging.getLogger("meshrun.checkpoint")

NODES_DIR = "_nodes"


def node_marker_name(node: int) -> str:
    return f"{NODES_DIR}/node_{node}.json"


def generation(manifest: Manifest) -> str:
    """The folder of a step's files in a remote store, fixed by the
    manifest's content digest: two different checkpoints of one step never
    share an object key."""
    return f"g{manifest.digest()[:16]}"


def data_name(manifest: Manifest, name: str) -> str:
    """Where file ``name`` of ``manifest`` lives inside its step's folder."""
    return f"{generation(manifest)}/{name}"


class StoreError(RuntimeError):
    """A transfer or verification failed (retryable)."""


class Store:
    """Interface; paths inside a step are '/'-separated relative names."""

    name: str  # for logs: never contains credentials
    tier: str  # "shared" | "s3"

    def put_files(self, step: int, local_dir: str, names: list[str], manifest: Manifest) -> int:
        """Copy ``names`` of a local checkpoint, verify each copy; skip files
        already present and verified. Returns bytes transferred."""
        raise NotImplementedError

    def put_bytes(self, step: int, name: str, data: bytes) -> None:
        raise NotImplementedError

    def get_bytes(self, step: int, name: str) -> bytes | None:
        raise NotImplementedError

    def delete(self, step: int, name: str) -> None:
        raise NotImplementedError

    def list_names(self, step: int, under: str = "") -> list[str]:
        raise NotImplementedError

    def list_steps(self) -> list[int]:
        """Steps with any object, ascending."""
        raise NotImplementedError

    def fetch_files(self, step: int, names: list[str], dest_dir: str, manifest: Manifest) -> None:
        """Download into ``dest_dir`` (temp name, then rename) and check each
        file's digest against the manifest; raises StoreError on a mismatch."""
        raise NotImplementedError

    def delete_step(self, step: int) -> None:
        """Delete one checkpoint, manifest first, so a partly deleted copy is
        never mistaken for a complete one."""
        raise NotImplementedError

    def read_manifest(self, step: int) -> Manifest | None:
        data = self.get_bytes(step, MANIFEST)
        if data is None:
            return None
        try:
            return Manifest.from_json(data.decode())
        except (ValueError, TypeError, KeyError) as e:
            log.warning(
                "checkpoint: %s step %d has an unusable manifest (%s); ignoring it", self.name, step, e
            )
            return None

    def complete_steps(self) -> list[int]:
        return [s for s in self.list_steps() if self.get_bytes(s, MANIFEST) is not None]

    def stale_names(self, step: int, keep: Manifest) -> list[str]:
        """Objects of ``step`` that belong to no generation but ``keep``'s
        (an older copy of the step, a re-save that never committed, files of
        the layout without generations); never the manifest or the markers."""
        mine = generation(keep) + "/"
        return [
            n
            for n in self.list_names(step)
            if n != MANIFEST and not n.startswith(NODES_DIR + "/") and not n.startswith(mine)
        ]

    def delete_names(self, step: int, names: list[str]) -> None:
        for n in names:
            self.delete(step, n)


def check_fetched(path: Path, name: str, entry: FileEntry, where: str) -> None:
    size = path.stat().st_size
    if size != entry.size:
        raise StoreError(f"{where}/{name}: downloaded {size} bytes, manifest says {entry.size}")
    if file_digest(path, entry.algo) != entry.digest:
        raise StoreError(f"{where}/{name}: downloaded copy fails its {entry.algo} check")


class DirStore(Store):
    """Tier 2: a directory on a shared filesystem (Lustre, NFS)."""

    tier = "shared"

    def __init__(self, root: str, threads: int = 4):
        self.root = Path(root)
        self.name = str(root)
        self.threads = threads

    def _p(self, step: int, name: str = "") -> Path:
        return self.root / step_dir_name(step) / name

    def _copy_verified(self, src: Path, dst: Path, entry: FileEntry) -> int:
        if dst.exists() and dst.stat().st_size == entry.size and file_digest(dst, entry.algo) == entry.digest:
            return 0
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f".{dst.name}.part{os.getpid()}")
        shutil.copyfile(src, tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        check_fetched(tmp, dst.name, entry, self.name)
        os.replace(tmp, dst)
        return entry.size

    def put_files(self, step: int, local_dir: str, names: list[str], manifest: Manifest) -> int:
        with ThreadPoolExecutor(self.threads) as pool:
            jobs = [
                pool.submit(
                    self._copy_verified,
                    Path(local_dir) / n,
                    self._p(step, data_name(manifest, n)),
                    manifest.files[n],
                )
                for n in names
            ]
            return sum(j.result() for j in jobs)

    def put_bytes(self, step: int, name: str, data: bytes) -> None:
        from train.checkpoint.manifest import atomic_write_bytes

        p = self._p(step, name)
        p.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(p, data)

    def get_bytes(self, step: int, name: str) -> bytes | None:
        try:
            return self._p(step, name).read_bytes()
        except OSError:
            return None

    def delete(self, step: int, name: str) -> None:
        self._p(step, name).unlink(missing_ok=True)

    def list_names(self, step: int, under: str = "") -> list[str]:
        base = self._p(step)
        d = base / under if under else base
        if not d.is_dir():
            return []
        return sorted(str(p.relative_to(base)) for p in d.rglob("*") if p.is_file())

    def list_steps(self) -> list[int]:
        if not self.root.is_dir():
            return []
        return sorted(s for n in os.listdir(self.root) if (s := parse_step_dir(n)) is not None)

    def fetch_files(self, step: int, names: list[str], dest_dir: str, manifest: Manifest) -> None:
        def one(n: str) -> None:
            dst = Path(dest_dir) / n
            tmp = dst.with_name(f".{dst.name}.part{os.getpid()}")
            try:
                shutil.copyfile(self._p(step, data_name(manifest, n)), tmp)
            except OSError as e:
                raise StoreError(f"{self.name}: cannot read {step_dir_name(step)}/{n}: {e}") from e
            check_fetched(tmp, n, manifest.files[n], f"{self.name}/{step_dir_name(step)}")
            os.replace(tmp, dst)

        with ThreadPoolExecutor(self.threads) as pool:
            for j in [pool.submit(one, n) for n in names]:
                j.result()

    def delete_names(self, step: int, names: list[str]) -> None:
        super().delete_names(step, names)
        base = self._p(step)
        for d in sorted({(base / n).parent for n in names}, key=lambda p: -len(p.parts)):
            if d != base and d.is_dir() and not any(d.iterdir()):
                d.rmdir()

    def delete_step(self, step: int) -> None:
        self._p(step, MANIFEST).unlink(missing_ok=True)
        shutil.rmtree(self._p(step), ignore_errors=True)
