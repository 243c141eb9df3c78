#!/usr/bin/env python
"""Data-loader throughput, measured side by side in one run on the same
files and cores:

- images/s of the DALI image pipeline vs the PIL + torch DataLoader fallback
  (same decode, random resized crop, flip and normalize, same worker count);
- tokens/s of the token loader (DALI external_source and the fallback).

Prints a table and, last, ``bench_data: dali_vs_pil=<ratio>``. Rounds
alternate between backends so load from other processes hits both alike.

    python scripts/bench_data.py [--images 1000] [--workers 2] [--rounds 3] [--device auto|cpu|cuda]
    python scripts/bench_data.py --quick   # seconds (CI)

``--device auto`` (the default) uses the GPU when there is one: DALI then
decodes with nvJPEG (``device="mixed"``) and both loaders deliver batches
on the GPU, as in training; ``cpu`` forces the CPU pipelines.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent


def make_images(root: Path, n: int, classes: int = 10, seed: int = 0) -> None:
    """Photo-like JPEGs (smooth fields plus noise, 300-500 px sides)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for i in range(n):
        d = root / f"class{i % classes}"
        d.mkdir(parents=True, exist_ok=True)
        h, w = (int(v) for v in rng.integers(300, 500, 2))
        base = rng.random((h // 16 + 2, w // 16 + 2, 3)) * 255
        img = Image.fromarray(base.astype(np.uint8)).resize((w, h), Image.BICUBIC)
        arr = np.asarray(img, dtype=np.int16) + rng.integers(-12, 12, (h, w, 3))
        Image.fromarray(arr.clip(0, 255).astype(np.uint8)).save(d / f"{i:05d}.jpg", quality=90)


def make_tokens(root: Path, n_tokens: int) -> Path:
    text = root / "text"
    text.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    (text / "corpus.txt").write_bytes(rng.integers(32, 127, n_tokens, dtype=np.uint8).tobytes())
    out = root / "shards"
    subprocess.run(
        [sys.executable, str(REPO / "scripts/prepare_tokens.py"), str(text), "--out", str(out)],
        check=True,
        capture_output=True,
    )
    return out


def spec_for(kind: str, path: Path, use_dali: bool, workers: int, batch: int, seq_len: int, image_size: int):
    from launcher.config.schema import RunConfig
    from launcher.config.spec import RunSpec
    from launcher.plan.make import make_plan

    cfg = RunConfig()
    cfg.cluster.local_processes = 1
    cfg.train.global_batch_size = batch
    if kind == "images":
        m = cfg.model
        m.family, m.image_size, m.patch_size, m.num_classes = "vit", image_size, 16, 10
    else:
        cfg.model.seq_len = seq_len
    d = cfg.data
    d.kind, d.name, d.path, d.use_dali, d.num_workers = kind, kind, str(path), use_dali, workers
    return RunSpec(cfg, make_plan(cfg), str(path))


def resolve_device(choice: str) -> str:
    """ "cuda:0" or "cpu" for --device auto|cpu|cuda."""
    import torch

    if choice == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_data: --device cuda, but torch sees no GPU (torch.cuda.is_available() is False)")
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        return "cuda:0"
    return "cpu"


def run_epoch(spec, device: str) -> tuple[int, float]:
    """(samples, seconds) for one epoch from a fresh loader on ``device``;
    the first batch (pipeline / worker start) is not timed."""
    import torch

    from train.data import build_loader
    from train.parallel.dist import DistInfo

    backend = "nccl" if device.startswith("cuda") else "gloo"
    loader = build_loader(spec, DistInfo(0, 1, 0, 1, 0, device, backend, "127.0.0.1", 0))
    n_batches = loader.order.batches_per_epoch
    next(loader)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(n_batches - 1):
        next(loader)
    sync()  # batches land on the GPU asynchronously
    return (n_batches - 1) * loader.batch_size, time.perf_counter() - t0


# --quick: 64 small JPEGs cropped to 64 px, 200k tokens, one round; the same four loaders.
QUICK = {"images": 64, "image_size": 64, "batch": 16, "tokens": 200_000, "seq_len": 256, "rounds": 1}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2, help="DALI threads = DataLoader workers")
    ap.add_argument("--tokens", type=int, default=20_000_000)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="", help="reuse / keep generated data here")
    ap.add_argument(
        "--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: the GPU when there is one"
    )
    ap.add_argument("--quick", action="store_true", help="small sizes: seconds (CI)")
    args = ap.parse_args(argv)
    if args.quick:  # re-parsed so that options given explicitly still win
        ap.set_defaults(**QUICK)
        args = ap.parse_args(argv)
    device = resolve_device(args.device)

    from train.data.dali_backend import check_dali

    why = check_dali()
    if why:
        print(f"bench_data: {why}; install nvidia-dali-cuda120 to compare", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.dir or tmp)
        images = root / f"images_{args.images}"
        if not images.is_dir():
            make_images(images, args.images)
        shards = root / "tokens" / "shards"
        if not shards.is_dir():
            make_tokens(root / "tokens", args.tokens)

        rows: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            for name, kind, path, use_dali, batch in (
                ("images  DALI", "images", images, True, args.batch),
                ("images  PIL+DataLoader", "images", images, False, args.batch),
                ("tokens  DALI", "tokens", shards, True, 8),
                ("tokens  DataLoader", "tokens", shards, False, 8),
            ):
                spec = spec_for(kind, path, use_dali, args.workers, batch, args.seq_len, args.image_size)
                n, dt = run_epoch(spec, device)
                per_s = n * (args.seq_len if kind == "tokens" else 1) / dt
                rows.setdefault(name, []).append(per_s)

    print(f"{'loader':<26}{'median':>14}{'min':>14}{'max':>14}  unit")
    for name, vals in rows.items():
        unit = "tokens/s" if name.startswith("tokens") else "images/s"
        print(f"{name:<26}{statistics.median(vals):>14,.0f}{min(vals):>14,.0f}{max(vals):>14,.0f}  {unit}")
    print(
        f"({args.images} JPEGs 300-500 px -> {args.image_size} px, batch {args.batch}, {args.workers} workers; "
        f"tokens: seq_len {args.seq_len}, batch 8; {args.rounds} rounds; device {device}"
        + (", DALI decodes on the GPU (nvJPEG)" if device.startswith("cuda") else "")
        + ")"
    )
    dali = statistics.median(rows["images  DALI"])
    pil = statistics.median(rows["images  PIL+DataLoader"])
    tok = statistics.median(rows["tokens  DALI"])
    print(f"bench_data: tokens_per_s={tok:.0f}")
    print(f"bench_data: dali_vs_pil={dali / pil:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
