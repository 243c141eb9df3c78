"""Benchmark: how long the training loop is blocked per checkpoint save.

Side by side in one run, same model and optimizer, same disk:
- tiered: ``CheckpointManager.save`` (async DCP to tier 1, commit + verified
  S3 upload in the background; S3 is moto's server in a subprocess);
- blocking: ``torch.distributed.checkpoint.save`` of the same state.
Saves alternate (tiered, then blocking, ...) with training steps in between;
before each blocking save the background work of the previous tiered save
is drained, so both are measured on a quiet machine.

    python scripts/bench_checkpoint.py [--dim 2048 --layers 8 --saves 4]

Last line: ``bench_checkpoint: blocked_ratio=<tiered/blocking>``.
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
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--saves", type=int, default=4)
    ap.add_argument("--steps-between", type=int, default=3)
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

        def train(n: int) -> float:
            t0 = time.perf_counter()
            for _ in range(n):
                model(x).square().mean().backward()
                opt.step()
                opt.zero_grad()
            return (time.perf_counter() - t0) / n

        train(2)  # warm-up; the optimizer state exists from here on
        ckpt = CheckpointManager(spec, info)
        tiered, blocking, after_tiered, quiet = [], [], [], []
        step = 0
        for i in range(args.saves):
            step += 1
            t0 = time.perf_counter()
            ckpt.save(step, app_state)
            tiered.append(time.perf_counter() - t0)
            after_tiered.append(train(args.steps_between))  # the background work competes here
            ckpt._wait_pending()
            assert ckpt.uploader is not None and ckpt.uploader.wait(600), "upload did not finish"
            path = os.path.join(base, "blocking", f"step_{i}")
            t0 = time.perf_counter()
            dcp.save(app_state, checkpoint_id=path, no_dist=True)
            blocking.append(time.perf_counter() - t0)
            shutil.rmtree(path)
            quiet.append(train(args.steps_between))  # nothing runs behind these steps
        report = ckpt.finalize(timeout_s=600)
        manifest = read_manifest(os.path.join(ckpt.root, f"step_{step}"))
        assert manifest is not None, "the last tiered save did not commit"
        state_mb = manifest.total_bytes / 1e6
        # The first save of each kind pays one-off costs (buffers, planning).
        t_med = statistics.median(tiered[1:] or tiered)
        b_med = statistics.median(blocking[1:] or blocking)
        print(
            f"model: {args.layers} x Linear({args.dim}, {args.dim}) + AdamW: {state_mb:.0f} MB per checkpoint"
        )
        print(
            f"step time: {statistics.mean(quiet):.3f} s quiet, {statistics.mean(after_tiered):.3f} s while "
            "a tiered save stages/writes/uploads behind (on CPU they share the cores)"
        )
        print("tiered blocked s per save:   " + " ".join(f"{t:.3f}" for t in tiered))
        print("blocking dcp.save s per save: " + " ".join(f"{t:.3f}" for t in blocking))
        print(
            f"upload: {report.get('upload_mb', 0):.0f} MB at {report.get('upload_mb_per_s', 0):.0f} MB/s "
            "(hash + multipart upload + verify, moto on loopback)"
        )
        print(f"load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        print(f"bench_checkpoint: blocked_ratio={t_med / b_med:.3f}")
    finally:
        moto.kill()
        moto.wait()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
