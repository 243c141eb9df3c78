"""The data formats both sides read, torch-free: pretokenized shards
(``index.json`` + raw token files, written by scripts/prepare_tokens.py), an
image folder (one sub-folder per class), a prompts file (JSONL), and
:func:`check_data`, the check the launcher runs before anything is written
and the trainer runs again on its node.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from launcher.config.schema import RunConfig
from launcher.config.validate import ConfigError, fail

INDEX_FILE = "index.json"
FORMAT = "meshrun-tokens-v1"
DTYPES = {"uint16": np.uint16, "uint32": np.uint32}


@dataclass(frozen=True)
class Shard:
    path: str
    num_tokens: int


class TokenShards:
    """Memory-mapped shards and the global window index over them."""

    def __init__(self, root: str, seq_len: int, vocab_size: int) -> None:
        index_path = Path(root) / INDEX_FILE
        if not Path(root).is_dir():
            raise ConfigError(
                f"data.path={root!r} is invalid: not a directory (make one with scripts/prepare_tokens.py)"
            )
        if not index_path.is_file():
            raise ConfigError(
                f"data.path={root!r} is invalid: no {INDEX_FILE} in it (make one with scripts/prepare_tokens.py)"
            )
        try:
            index = json.loads(index_path.read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(f"data.path={root!r} is invalid: unreadable {INDEX_FILE}: {e}") from e
        dtype_name = index.get("dtype")
        if index.get("format") != FORMAT or dtype_name not in DTYPES:
            raise ConfigError(
                f"data.path={root!r} is invalid: {INDEX_FILE} is not a {FORMAT} index with dtype "
                f"{' or '.join(DTYPES)} (got format={index.get('format')!r}, dtype={dtype_name!r})"
            )
        self.dtype = np.dtype(DTYPES[dtype_name])
        self.seq_len = seq_len
        data_vocab = int(index.get("vocab_size", 0))
        if data_vocab > vocab_size:
            raise ConfigError(
                f"model.vocab_size={vocab_size} is invalid: the shards in {root} use {data_vocab} token ids"
            )
        self.shards = [self._check_shard(Path(root), entry) for entry in index.get("shards", [])]
        if not self.shards:
            raise ConfigError(f"data.path={root!r} is invalid: {INDEX_FILE} lists no shards")
        self.windows_per_shard = np.array(
            [(s.num_tokens - 1) // seq_len for s in self.shards], dtype=np.int64
        )
        self.window_offsets = np.concatenate([[0], np.cumsum(self.windows_per_shard)])
        self._maps: list[np.memmap | None] = [None] * len(self.shards)

    def _check_shard(self, root: Path, entry: dict) -> Shard:
        path = root / entry["file"]
        try:
            size = os.path.getsize(path)
        except OSError as e:
            raise ConfigError(f"data.path={str(root)!r}: shard {entry['file']} is unreadable: {e}") from e
        if size % self.dtype.itemsize:
            raise ConfigError(
                f"data.path={str(root)!r}: shard {entry['file']} has {size} bytes, not a whole number "
                f"of {self.dtype.name} tokens ({self.dtype.itemsize} bytes each)"
            )
        n = size // self.dtype.itemsize
        if n != int(entry["num_tokens"]):
            raise ConfigError(
                f"data.path={str(root)!r}: shard {entry['file']} holds {n} tokens but {INDEX_FILE} says "
                f"{entry['num_tokens']} (truncated or rewritten?)"
            )
        if n < self.seq_len + 1:
            raise ConfigError(
                f"model.seq_len={self.seq_len} is invalid: shard {entry['file']} in {root} has only {n} tokens, "
                f"fewer than one window of seq_len + 1; use a smaller seq_len or larger shards"
            )
        return Shard(str(path), n)

    def __len__(self) -> int:
        return int(self.window_offsets[-1])

    def _map(self, i: int) -> np.memmap:
        m = self._maps[i]
        if m is None:
            m = np.memmap(self.shards[i].path, dtype=self.dtype, mode="r")
            self._maps[i] = m
        return m

    def window(self, sample: int) -> np.ndarray:
        """Tokens of window ``sample`` (seq_len + 1 of them, a memmap view)."""
        shard = int(np.searchsorted(self.window_offsets, sample, side="right")) - 1
        start = (sample - int(self.window_offsets[shard])) * self.seq_len
        return self._map(shard)[start : start + self.seq_len + 1]

    def batch(self, ids: np.ndarray) -> np.ndarray:
        """[len(ids), seq_len + 1] int64 array."""
        return np.stack([self.window(int(i)) for i in ids]).astype(np.int64)

    def __getstate__(self) -> dict:
        # Worker processes reopen the maps themselves.
        state = dict(self.__dict__)
        state["_maps"] = [None] * len(self.shards)
        return state


EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
_MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"BM", b"RIFF")


@dataclass
class ImageFolder:
    root: str
    files: list[str]  # sorted; sample id = position
    labels: np.ndarray  # int64 class index per file
    classes: list[str]
    rejected: list[tuple[str, str]]  # (file, why) left out by the scan


def _looks_like_image(path: str) -> str:
    """Why ``path`` cannot be an image ('' if it may be one). Reads 8 bytes:
    cheap enough for millions of files; broken bodies are found at decode."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError as e:
        return f"unreadable ({e.strerror})"
    if not head:
        return "empty file"
    if not head.startswith(_MAGIC):
        return "not a JPEG/PNG/BMP/WebP file"
    return ""


def scan_folder(root: str, num_classes: int) -> ImageFolder:
    if not os.path.isdir(root):
        raise ConfigError(f"data.path={root!r} is invalid: not a directory of class sub-folders")
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise ConfigError(
            f"data.path={root!r} is invalid: no class sub-folders (expected <path>/<class>/*.jpg)"
        )
    if len(classes) > num_classes:
        raise ConfigError(
            f"model.num_classes={num_classes} is invalid: data.path={root!r} has {len(classes)} classes"
        )
    files, labels, rejected = [], [], []
    for label, name in enumerate(classes):
        for dirpath, _, names in sorted(os.walk(os.path.join(root, name))):
            for fname in sorted(names):
                if not fname.lower().endswith(EXTENSIONS):
                    continue
                path = os.path.join(dirpath, fname)
                why = _looks_like_image(path)
                if why:
                    rejected.append((path, why))
                    continue
                files.append(path)
                labels.append(label)
    if not files:
        raise ConfigError(
            f"data.path={root!r} is invalid: no readable images ({', '.join(EXTENSIONS)}) found"
        )
    return ImageFolder(root, files, np.asarray(labels, dtype=np.int64), classes, rejected)


def check_data(cfg: RunConfig) -> int:
    """Open and check the dataset of ``cfg`` (index, shard sizes, seq_len,
    vocabulary, image folder); return its number of samples. Raises
    ConfigError naming the field and the problem. Torch-free."""
    d, m = cfg.data, cfg.model
    if d.kind == "tokens":
        return len(TokenShards(d.path, m.seq_len, m.vocab_size))
    if d.kind == "images":
        folder = scan_folder(d.path, m.num_classes)
        if d.on_bad_sample == "fail" and folder.rejected:
            path, why = folder.rejected[0]
            raise ConfigError(f"data: image {path} is unusable ({why}) and data.on_bad_sample='fail'")
        return len(folder.files)
    return 0


def read_prompts(path: str) -> list[dict]:
    """Every line of a prompts file, each a JSON object with a "prompt" string
    ({"prompt": str, "id": optional}); blank lines skipped, the first bad line
    named. The launcher checks the file with it and generate reads it with it."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as e:
                raise fail("job.prompts", path, f"line {n} is not JSON ({e})") from e
            if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
                raise fail("job.prompts", path, f'line {n} is not an object with a "prompt" string')
            out.append(obj)
    return out
