"""Preflight all-reduce bus-bandwidth test: ``python -m train.observe.preflight_comm
RUN_DIR`` (its entry: __main__.py here) on every task of the job (the same layout as training), after the
per-node checks (``python -m launcher.preflight --node``).

Bus bandwidth as nccl-tests defines it: ``bytes / time x 2(n-1)/n``, which is
comparable across world sizes and is what the link carries. Rank 0 compares
it with the fabric's expected figure (``launcher.nccl``), writes
``RUN_DIR/preflight/allreduce.json`` and exits 1 on a failure, which stops
the job before training. The sum is also checked, so a rank that computes
garbage fails too.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from launcher.config.ncclenv import expected_busbw_gb_per_s
from launcher.config.runfiles import ALLREDUCE_FILE
from launcher.config.spec import load_spec
from train.parallel.dist import dist_info_from_env, init_process_group

WARMUP = 3
ITERS = 10
WARN_BELOW = 0.8  # of the expected figure
FAIL_BELOW = 0.5


def busbw_gb_per_s(nbytes: int, seconds: float, world: int) -> float:
    return nbytes / seconds * 2 * (world - 1) / world / 1e9 if world > 1 else 0.0


def judge(busbw: float, expected: float) -> tuple[str, str]:
    if expected <= 0:
        return "pass", "no expected figure for this fabric/device; measured only"
    ratio = busbw / expected
    if ratio < FAIL_BELOW:
        return "fail", f"{ratio:.0%} of the expected {expected:.0f} GB/s"
    if ratio < WARN_BELOW:
        return "warn", f"{ratio:.0%} of the expected {expected:.0f} GB/s"
    return "pass", f"{ratio:.0%} of the expected {expected:.0f} GB/s"


def run(run_dir: str, single_node: bool = False, out_dir: str | None = None) -> int:
    spec = load_spec(run_dir)
    info = dist_info_from_env(spec.plan.device)
    init_process_group(info, timeout_s=300)
    cluster = spec.cfg.cluster
    size_mb = cluster.preflight_allreduce_mb or (512.0 if spec.plan.device == "cuda" else 16.0)
    n = int(size_mb * 1e6) // 4
    device = torch.device(info.device)
    x = torch.full((n,), float(info.rank + 1), dtype=torch.float32, device=device)
    for _ in range(WARMUP):
        dist.all_reduce(x)
    x.fill_(float(info.rank + 1))
    dist.all_reduce(x)
    want = info.world_size * (info.world_size + 1) / 2
    correct = bool(torch.all(x[:1024] == want).item()) and bool(x[-1].item() == want)
    if device.type == "cuda":
        torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(ITERS):
        dist.all_reduce(x)
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = (time.perf_counter() - t0) / ITERS
    # The slowest rank's time is the collective's time.
    t = torch.tensor([elapsed], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    ok = torch.tensor([1 if correct else 0], device=device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    code = 0
    if info.rank == 0:
        nbytes = n * 4
        bw = busbw_gb_per_s(nbytes, float(t.item()), info.world_size)
        expected = expected_busbw_gb_per_s(cluster, nodes=1 if single_node else spec.plan.nodes)
        status, verdict = judge(bw, expected)
        if not ok.item():
            status, verdict = "fail", "wrong all-reduce result on at least one rank"
        detail = (
            f"{bw:.2f} GB/s bus bandwidth, {nbytes / 1e6:.0f} MB x {ITERS} over {info.world_size} ranks "
            f"({info.backend}, {float(t.item()) * 1e3:.1f} ms each): {verdict}"
        )
        nodes = os.environ.get("SLURM_JOB_NODELIST", os.environ.get("SLURMD_NODENAME", "this node"))
        out = Path(out_dir) if out_dir else Path(run_dir) / "preflight"
        out.mkdir(parents=True, exist_ok=True)
        record = {
            "nodes": nodes,
            "busbw_gb_per_s": bw,
            "expected_gb_per_s": expected,
            "size_bytes": nbytes,
            "world_size": info.world_size,
            "check": {"name": "allreduce", "status": status, "detail": detail},
        }
        tmp = out / ".allreduce.tmp"
        tmp.write_text(json.dumps(record, indent=1) + "\n")
        os.replace(tmp, out / ALLREDUCE_FILE)
        print(f"meshrun: preflight all-reduce {status.upper()}: {detail}", flush=True)
        if status == "fail":
            print(
                f"meshrun: preflight FAILED: all-reduce across {nodes}: {verdict}. Training was not started; "
                "check `ibstat` / `python -m launcher.preflight --report RUN_DIR` per node, or bisect with "
                "sbatch --exclude=<node>.",
                file=sys.stderr,
                flush=True,
            )
            code = 1
    dist.barrier()
    dist.destroy_process_group()
    return code
