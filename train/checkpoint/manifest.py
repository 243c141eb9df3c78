"""The checkpoint manifest: the commit record of one checkpoint.

A checkpoint directory ``step_<N>/`` (N unpadded) holds DCP shards (``__<rank>_<i>.distcp``),
DCP's ``.metadata``, one ``extra_rank<r>.pt`` per rank (RNG, data-loader, LR
schedule and progress state, which differ per rank or are not tensors) and,
written last and atomically, ``manifest.json``: every file with its size and
digest, the rank that wrote it, the layout, step and config hash. A directory
without a manifest is not a checkpoint; one whose files do not match their
manifest entry is corrupt. Standard library only, plus ``xxhash`` for the
digests (imported where a file is hashed).

File digests are XXH3-128 (``DIGEST``): a checkpoint's digests detect
corruption and truncation between tiers, they authenticate nothing (the
run that checks them wrote them), and XXH3 hashes at about 8 GB/s a core
where sha256 does about 1 (this host), CPU the save and the upload spend
beside training. Manifests written with sha256 digests (before XXH3) still
load and verify: each entry names its algorithm.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

log = logging.getLogger("meshrun.checkpoint")

FORMAT = "meshrun-checkpoint-1"
MANIFEST = "manifest.json"
DCP_METADATA = ".metadata"
STEP_DIR_RE = re.compile(r"^step_(\d+)$")
_HASH_CHUNK = 8 << 20
DIGEST = "xxh3_128"
DIGESTS = ("xxh3_128", "sha256")


def _unknown_digest(algo: str) -> ValueError:
    return ValueError(f"unknown file digest {algo!r} (known: {', '.join(DIGESTS)})")


def new_hasher(algo: str = DIGEST) -> Any:
    """An incremental hasher for ``algo`` (``update``, ``hexdigest``); both
    release the GIL on large buffers."""
    if algo == "xxh3_128":
        import xxhash

        return xxhash.xxh3_128()
    if algo == "sha256":
        return hashlib.sha256()
    raise _unknown_digest(algo)


def bytes_digest(data: bytes | memoryview, algo: str = DIGEST) -> str:
    h = new_hasher(algo)
    h.update(data)
    return h.hexdigest()


def step_dir_name(step: int) -> str:
    return f"step_{step}"


def parse_step_dir(name: str) -> int | None:
    m = STEP_DIR_RE.match(name)
    return int(m.group(1)) if m else None


def extra_file_name(rank: int) -> str:
    return f"extra_rank{rank}.pt"


@dataclass
class FileEntry:
    size: int
    # Hex digest of the file's bytes by ``algo`` (one of DIGESTS).
    digest: str
    # Rank that wrote the file; -1 for files written by the coordinator only
    # (DCP's .metadata), which belong to node 0.
    rank: int
    algo: str = DIGEST

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FileEntry:
        if "sha256" in d:  # written before entries named their algorithm
            d = {"size": d["size"], "digest": d["sha256"], "rank": d["rank"], "algo": "sha256"}
        entry = cls(**d)
        if entry.algo not in DIGESTS:
            raise _unknown_digest(entry.algo)
        return entry


class ManifestError(ValueError):
    """A manifest that must not be used (it names a file outside its step)."""


def check_file_name(name: object) -> str:
    """Why ``name`` is no plain file name inside a step directory ('' when
    it is one). A manifest's names become paths (verify, unlink, download
    into the step directory): no separator (so no absolute path, no
    ``..``-walk, no Windows-style ``\\``), no ``.`` or ``..``, no NUL or
    other control character."""
    if not isinstance(name, str) or not name:
        return "not a non-empty string"
    if name in (".", ".."):
        return "names a directory, not a file"
    if "/" in name or "\\" in name:
        return "has a path separator (absolute or outside the step directory)"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        return "has a NUL or other control character"
    return ""


@dataclass
class Manifest:
    step: int
    config_hash: str
    world_size: int
    # Named mesh dims at save time, e.g. {"pp": 1, "dp_replicate": 1, ...}.
    mesh: dict[str, int]
    # rank -> node index (the order of nodes in the run), for per-node uploads.
    rank_nodes: list[int]
    files: dict[str, FileEntry]
    created_unix: float = 0.0
    format: str = FORMAT
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def num_nodes(self) -> int:
        return max(self.rank_nodes) + 1 if self.rank_nodes else 1

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files.values())

    def node_files(self, node: int) -> list[str]:
        """Files a node uploads: those its ranks wrote (+ .metadata on node 0)."""
        out = []
        for name, entry in sorted(self.files.items()):
            owner = 0 if entry.rank < 0 else self.rank_nodes[entry.rank]
            if owner == node:
                out.append(name)
        return out

    def subset(self, names: Iterable[str]) -> Manifest:
        """The same checkpoint restricted to ``names`` (for verifying part of it)."""
        return replace(self, files={n: self.files[n] for n in names})

    def digest(self) -> str:
        """Identity of this checkpoint's content (a re-save of the same step
        after a resume is a different checkpoint)."""
        files = {k: [v.size, v.digest] for k, v in sorted(self.files.items())}
        return hashlib.sha256(json.dumps([self.step, files]).encode()).hexdigest()[:32]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        d = json.loads(text)
        if d.get("format") != FORMAT:
            raise ValueError(f"unknown checkpoint format {d.get('format')!r} (expected {FORMAT})")
        for name in d["files"]:
            if why := check_file_name(name):
                raise ManifestError(
                    f"manifest of step {d.get('step')} refused: file name {name!r} {why}; "
                    "a manifest names plain files inside its step directory"
                )
        d["files"] = {k: FileEntry.from_dict(v) for k, v in d["files"].items()}
        return cls(**d)


def file_digest(path: str | os.PathLike[str], algo: str = DIGEST) -> str:
    h = new_hasher(algo)
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def describe_files(
    directory: str | os.PathLike[str], names: Iterable[str], rank: int
) -> dict[str, FileEntry]:
    d = Path(directory)
    return {n: FileEntry(size=(d / n).stat().st_size, digest=file_digest(d / n), rank=rank) for n in names}


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write, fsync, rename, fsync the directory: after a crash the file is
    either absent or whole, and it is on disk before anything written later."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(directory: str | os.PathLike[str], manifest: Manifest) -> None:
    atomic_write_bytes(Path(directory) / MANIFEST, manifest.to_json().encode())


def read_manifest(directory: str | os.PathLike[str]) -> Manifest | None:
    """The manifest, or None when absent or unreadable (not a checkpoint);
    one that names a file outside its step is refused with a warning."""
    try:
        return Manifest.from_json((Path(directory) / MANIFEST).read_text())
    except ManifestError as e:
        log.warning("checkpoint: %s: %s; ignoring it", directory, e)
        return None
    except (OSError, ValueError, TypeError, KeyError):
        return None


def verify_file(directory: str | os.PathLike[str], name: str, entry: FileEntry, *, deep: bool = True) -> str:
    """'' when the file matches its entry, else why not."""
    path = Path(directory) / name
    try:
        size = path.stat().st_size
    except OSError:
        return f"{name} is missing"
    if size != entry.size:
        return f"{name} has {size} bytes, manifest says {entry.size}"
    if deep and file_digest(path, entry.algo) != entry.digest:
        return f"{name} fails its {entry.algo} check (corrupt)"
    return ""


def check_files(
    directory: str | os.PathLike[str], manifest: Manifest, names: list[str], *, threads: int = 1
) -> list[str]:
    """For each of ``names``: '' when intact, else the problem (hashed on ``threads`` threads)."""

    def check(n: str) -> str:
        return verify_file(directory, n, manifest.files[n])

    if threads > 1 and len(names) > 1:
        with ThreadPoolExecutor(min(threads, len(names))) as pool:
            return list(pool.map(check, names))
    return [check(n) for n in names]


def verify_dir(
    directory: str | os.PathLike[str],
    manifest: Manifest,
    *,
    deep: bool = True,
    threads: int = 1,
    names_only: bool = False,
) -> list[str]:
    """Problems found, or with ``names_only`` the files that have one (empty:
    every file is intact). Hashing runs on ``threads`` threads."""
    names = sorted(manifest.files)

    def check(n: str) -> str:
        return verify_file(directory, n, manifest.files[n], deep=deep)

    if threads > 1 and len(names) > 1:
        with ThreadPoolExecutor(min(threads, len(names))) as pool:
            results = list(pool.map(check, names))
    else:
        results = [check(n) for n in names]
    return [n if names_only else p for n, p in zip(names, results, strict=True) if p]


def list_steps(root: str | os.PathLike[str], *, complete_only: bool = True) -> list[int]:
    """Step numbers under ``root``, ascending; by default only those with a manifest."""
    try:
        entries = os.listdir(root)
    except FileNotFoundError:
        return []
    steps = []
    for name in entries:
        step = parse_step_dir(name)
        if step is None:
            continue
        if complete_only and not os.path.exists(os.path.join(root, name, MANIFEST)):
            continue
        steps.append(step)
    return sorted(steps)
