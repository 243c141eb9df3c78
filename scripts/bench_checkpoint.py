"""Benchmark: what checkpointing adds to the training loop's wall time.

Side by side in one process, same model, optimizer, state and disk, the same
loop of ``--steps`` steps is timed four ways: without saves, with a tiered
save (``CheckpointManager.save``: async DCP to tier 1, commit + verified S3
upload in the background; S3 is moto's server in a subprocess) every
``--every`` steps, with a blocking ``torch.distributed.checkpoint.save`` of
the same state every ``--every`` steps, and without saves again (drift).
The added wall time per save is (loop time with saves - loop time without)
/ saves, so it counts everything a save costs the loop: the time save()
blocks, the optimizer step held for staging, the slowdown of later steps
while the background work competes for the cores and the interpreter lock,
and the wait for the last commit at the end. (The S3 upload that may still
run after the loop is not counted: it delays nothing the loop does.)

    python scripts/bench_checkpoint.py [--dim 2048 --layers 6 --steps 40 --every 5]

Last line: ``bench_checkpoint: blocked_ratio=<tiered added s per save /
blocking added s per save>`` (1 rank).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_moto(port: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1)
            return proc
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("moto server did not start") from None
            time.sleep(0.2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--dir", default="", help="disk to save to (default: a temp dir)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")

    import boto3
    import torch
    import torch.distributed.checkpoint as dcp
    from ckpt_drill import build_model

    from launcher.plan import make_plan
    from launcher.runid import new_run_id
    from launcher.schema import ClusterConfig, RunConfig, StorageConfig, TrainConfig
    from launcher.spec import RunSpec
    from train.checkpoint import CheckpointManager
    from train.checkpoint.manifest import read_manifest
    from train.dist import DistInfo
    from train.state import ModelState, OptimState

    port = _free_port()
    moto = _start_moto(port)
    endpoint = f"http://127.0.0.1:{port}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="bench")
    base = tempfile.mkdtemp(prefix="bench_ckpt_", dir=args.dir or None)
    try:
        cfg = RunConfig(
            cluster=ClusterConfig(local_processes=1),
            storage=StorageConfig(
                save_every_steps=10**9,
                keep_local=2,
                keep_remote=2,
                s3_bucket="bench",
                s3_endpoint_url=endpoint,
            ),
            train=TrainConfig(steps=10**6),
        )
        spec = RunSpec(
            cfg=cfg, plan=make_plan(cfg), run_dir=os.path.join(base, "run"), run_id=new_run_id("bench-ckpt")
        )
        info = DistInfo(0, 1, 0, 1, 0, "cpu", "gloo", "127.0.0.1", 0)
        model = build_model(args.dim, args.layers, 1)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        app_state = {"model": ModelState([model]), "optim": OptimState([model], [opt])}
        x = torch.randn(16, args.dim)

        def one_step() -> None:
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()

        def loop(save: Any) -> float:
            t0 = time.perf_counter()
            for step in range(1, args.steps + 1):
                one_step()
                if save is not None and step % args.every == 0:
                    save(step)
            return time.perf_counter() - t0

        for _ in range(2):  # warm-up; the optimizer state exists from here on
            one_step()
        ckpt = CheckpointManager(spec, info)
        offset = 0

        def tiered(step: int) -> None:
            ckpt.save(offset + step, app_state)

        def blocking(step: int) -> None:
            path = os.path.join(base, "blocking", f"step_{step}")
            dcp.save(app_state, checkpoint_id=path, no_dist=True)

        saves = args.steps // args.every
        # One untimed tiered save first: buffers and the first plan are one-off costs.
        ckpt.save(10**6, app_state)
        ckpt._wait_pending()
        assert ckpt.uploader is not None and ckpt.uploader.wait(600), "upload did not finish"
        offset = 10**6
        none_a = loop(None)
        t0 = time.perf_counter()
        with_tiered = loop(tiered)
        ckpt._wait_pending()  # the last commit is part of what the loop waits for
        with_tiered = time.perf_counter() - t0
        assert ckpt.uploader.wait(600), "upload did not finish"
        blocking(0)  # untimed warm-up of the blocking path
        with_blocking = loop(blocking)
        none_b = loop(None)
        report = ckpt.finalize(timeout_s=600)
        manifest = read_manifest(os.path.join(ckpt.root, f"step_{offset + saves * args.every}"))
        assert manifest is not None, "the last tiered save did not commit"
        state_mb = manifest.total_bytes / 1e6
        base_s = (none_a + none_b) / 2
        t_added = (with_tiered - base_s) / saves
        b_added = (with_blocking - base_s) / saves
        print(
            f"model: {args.layers} x Linear({args.dim}, {args.dim}) + AdamW: {state_mb:.0f} MB per checkpoint; "
            f"{args.steps} steps, a save every {args.every} ({saves} saves), 1 rank"
        )
        print(
            f"loop s: no saves {none_a:.2f} / {none_b:.2f}, tiered {with_tiered:.2f}, blocking {with_blocking:.2f}"
        )
        print(
            f"added s per save: tiered {t_added:.3f} (save() itself {statistics.mean(ckpt.blocked_s[1:]):.3f}), "
            f"blocking {b_added:.3f}"
        )
        print(
            f"upload: {report.get('upload_mb', 0):.0f} MB at {report.get('upload_mb_per_s', 0):.0f} MB/s "
            "(hash + multipart upload + verify, moto on loopback)"
        )
        print(f"load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        if b_added <= 0:
            # The blocking saves cost nothing measurable: the machine is too noisy.
            print("bench_checkpoint: blocked_ratio=nan")
            return 1
        print(f"bench_checkpoint: blocked_ratio={max(t_added, 0.0) / b_added:.3f}")
    finally:
        moto.kill()
        moto.wait()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
