"""Benchmark: does work at the lowest CPU priority stay off the training loop?

bench_checkpoint's loop (``--layers`` x Linear(``--dim``) + AdamW, FSDP2
over gloo, one thread a rank) is timed with ``--ranks`` ranks, alternately
alone and beside a SCHED_IDLE process that hashes (sha256) without pause:
the lowest priority Linux has, so in theory it only runs when a core would
otherwise idle. Where the ranks leave no core free, the slowdown shows what
any background work (a checkpoint's write and hashing, an S3 server's
request handling) costs the loop on this host, whatever its priority.

    python scripts/bench_idle_hog.py [--ranks 2 --steps 20 --rounds 2]
    python scripts/bench_idle_hog.py --quick   # seconds (CI)

``--quick``: 1 rank of 2 x Linear(1024), 20 steps, one round (on 2 cores
the hog then has a core of its own: the path, not the contended case).

Last line: ``bench_idle_hog: slowdown=<loop time beside the hog / alone>``
(medians over the rounds).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench_checkpoint import run_ranks  # noqa: E402


def _rank_main(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist
    from ckpt_drill import build_model

    torch.set_num_threads(1)
    world = int(os.environ["WORLD_SIZE"])
    if world > 1:
        dist.init_process_group("gloo")
    model = build_model(args.dim, args.layers, world)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(16, args.dim)

    def step() -> None:
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()

    for _ in range(3):
        step()
    if world > 1:
        dist.barrier()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    if int(os.environ["RANK"]) == 0:
        print(time.perf_counter() - t0, flush=True)
    if world > 1:
        dist.destroy_process_group()
    return 0


def _hog() -> None:
    import hashlib

    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    data = os.urandom(64 << 20)
    while True:
        hashlib.sha256(data).digest()


def _loop(args: argparse.Namespace) -> float:
    cmd = [sys.executable, os.path.abspath(__file__), "--rank-main"]
    cmd += ["--dim", str(args.dim), "--layers", str(args.layers), "--steps", str(args.steps)]
    return float(run_ranks(cmd, args.ranks))


# --quick: one rank (each rank process costs seconds of start-up), small loop, one round.
QUICK = {"ranks": 1, "dim": 1024, "layers": 2, "steps": 20, "rounds": 1}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="small sizes: seconds (CI)")
    ap.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--hog", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:  # re-parsed so that options given explicitly still win
        ap.set_defaults(**QUICK)
        args = ap.parse_args()
    if args.rank_main:
        return _rank_main(args)
    if args.hog:
        _hog()
        return 0
    alone, beside = [], []
    for r in range(args.rounds):
        alone.append(_loop(args))
        hog = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--hog"])
        try:
            time.sleep(1)
            beside.append(_loop(args))
        finally:
            hog.kill()
            hog.wait()
        print(
            f"round {r + 1}: {args.steps} steps alone {alone[-1]:.2f} s, beside the idle hog {beside[-1]:.2f} s"
        )
    print(f"{args.ranks} rank(s) on {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f}")
    print(f"bench_idle_hog: slowdown={statistics.median(beside) / statistics.median(alone):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
