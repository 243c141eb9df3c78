#!/usr/bin/env python
"""Turn text files into meshrun token shards (data=tokens).

    python scripts/prepare_tokens.py corpus/ more.txt --out data/tokens
    python scripts/prepare_tokens.py corpus/ --out data/tok --tokenizer tokenizer.json

Byte-level tokens (vocabulary 256, no download) by default; ``--tokenizer``
takes a local Hugging Face ``tokenizer.json`` (needs the ``tokenizers``
package). Writes raw little-endian uint16 (vocabulary <= 65536) or uint32
shards of about ``--shard-tokens`` tokens and ``index.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

INDEX_FILE = "index.json"  # same as launcher.config.datasets (kept torch-free here)
FORMAT = "meshrun-tokens-v1"


def text_files(inputs: list[str]) -> Iterator[Path]:
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            yield from sorted(q for q in p.rglob("*") if q.is_file() and not q.name.startswith("."))
        elif p.is_file():
            yield p
        else:
            raise SystemExit(f"prepare_tokens: input {item} does not exist")


def make_tokenizer(spec: str) -> tuple[Callable[[str], list[int]], int, int | None, str]:
    """(encode, vocab_size, end-of-document id or None, description)."""
    if spec == "bytes":
        return (lambda text: list(text.encode("utf-8"))), 256, None, "bytes"
    try:
        from tokenizers import Tokenizer
    except ImportError as e:
        raise SystemExit("prepare_tokens: --tokenizer FILE needs `pip install tokenizers`") from e
    tok = Tokenizer.from_file(spec)
    eos = next(
        (tok.token_to_id(t) for t in ("</s>", "<|endoftext|>", "<eos>") if tok.token_to_id(t) is not None),
        None,
    )
    return (lambda text: tok.encode(text).ids), tok.get_vocab_size(), eos, os.path.basename(spec)


class ShardWriter:
    def __init__(self, out: Path, dtype: np.dtype, shard_tokens: int) -> None:
        self.out, self.dtype, self.shard_tokens = out, dtype, shard_tokens
        self.pending: list[np.ndarray] = []
        self.pending_n = 0
        self.shards: list[dict] = []

    def add(self, ids: list[int]) -> None:
        arr = np.asarray(ids, dtype=self.dtype)
        self.pending.append(arr)
        self.pending_n += len(arr)
        # Keep 2 x shard_tokens buffered so the remainder joins the last shard
        # instead of forming a tiny one shorter than a training window.
        while self.pending_n >= 2 * self.shard_tokens:
            self._flush(self.shard_tokens)

    def _flush(self, n: int) -> None:
        data = np.concatenate(self.pending)
        name = f"shard_{len(self.shards):05d}.bin"
        data[:n].astype(self.dtype.newbyteorder("<"), copy=False).tofile(self.out / name)
        self.shards.append({"file": name, "num_tokens": int(n)})
        rest = data[n:]
        self.pending, self.pending_n = ([rest] if len(rest) else []), len(rest)

    def close(self) -> None:
        if self.pending_n:
            self._flush(self.pending_n)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="+", help="text files or directories of them")
    ap.add_argument("--out", required=True, help="output directory (data.path)")
    ap.add_argument("--tokenizer", default="bytes", help="'bytes' or a local tokenizer.json")
    ap.add_argument("--shard-tokens", type=int, default=64 * 1024 * 1024, help="tokens per shard (about)")
    ap.add_argument("--dtype", choices=("auto", "uint16", "uint32"), default="auto")
    args = ap.parse_args(argv)
    if args.shard_tokens < 1:
        raise SystemExit(f"prepare_tokens: --shard-tokens={args.shard_tokens} must be >= 1")

    encode, vocab, eos, desc = make_tokenizer(args.tokenizer)
    dtype_name = args.dtype if args.dtype != "auto" else ("uint16" if vocab <= 1 << 16 else "uint32")
    if dtype_name == "uint16" and vocab > 1 << 16:
        raise SystemExit(f"prepare_tokens: vocabulary {vocab} does not fit uint16; use --dtype uint32")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    writer = ShardWriter(out, np.dtype(dtype_name), args.shard_tokens)
    n_files = 0
    for path in text_files(args.inputs):
        ids = encode(path.read_text(encoding="utf-8", errors="replace"))
        if eos is not None:
            ids.append(eos)
        writer.add(ids)
        n_files += 1
    writer.close()
    if not writer.shards:
        raise SystemExit("prepare_tokens: the inputs hold no text")
    index = {
        "format": FORMAT,
        "dtype": dtype_name,
        "vocab_size": vocab,
        "tokenizer": desc,
        "documents": n_files,
        "shards": writer.shards,
    }
    (out / INDEX_FILE).write_text(json.dumps(index, indent=1) + "\n")
    total = sum(s["num_tokens"] for s in writer.shards)
    print(
        f"prepare_tokens: {n_files} files -> {total} {dtype_name} tokens in {len(writer.shards)} shards at {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
