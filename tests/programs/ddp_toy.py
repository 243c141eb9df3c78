"""A plain PyTorch DDP program that knows nothing of meshrun: env://
rendezvous, a tiny regression model, step lines on stdout, a checkpoint in
$MESHRUN_CHECKPOINT_DIR (or ./checkpoints) every few steps and on SIGTERM.
What tests/local/test_scriptjob.py and tests/cluster/test_scriptjob_slurm.py
run as job=script (no third-party example
program ships in the installed packages)."""

from __future__ import annotations

import argparse
import os
import signal
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

stop = False


def _on_term(signum: int, frame: object) -> None:
    global stop
    stop = True


def main() -> int:
    ap = argparse.ArgumentParser()
    # DDP_TOY_STEPS (cluster.env): more steps for a continuation whose arguments stay the same.
    ap.add_argument("--steps", type=int, default=int(os.environ.get("DDP_TOY_STEPS") or 20))
    ap.add_argument("--save-every", type=int, default=5)
    ap.add_argument("--sleep", type=float, default=0.0)
    # As most programs do: progress on global rank 0 only (under torchrun, on whichever node it is).
    ap.add_argument("--rank0-prints", action="store_true")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, _on_term)
    dist.init_process_group("gloo")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ckpt_dir = os.environ.get("MESHRUN_CHECKPOINT_DIR", "checkpoints")
    path = os.path.join(ckpt_dir, "last.pt")
    start = 0
    if os.path.exists(path):
        state = torch.load(path)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
        print(f"resumed from step {start}", flush=True)
    gen = torch.Generator().manual_seed(1234 + rank)
    w = torch.arange(8, dtype=torch.float32)
    step = start
    while step < args.steps:
        x = torch.randn(16, 8, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x).squeeze(1), x @ w)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if rank == 0 or not args.rank0_prints:
            print(f"step {step} loss {loss.item():.4f} world {world}", flush=True)
        flag = torch.tensor([int(stop)])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if step % args.save_every == 0 or flag.item() or step == args.steps:
            if rank == 0:
                os.makedirs(ckpt_dir, exist_ok=True)
                torch.save(
                    {"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step}, path + ".tmp"
                )
                os.replace(path + ".tmp", path)
            dist.barrier()
        if flag.item():
            print(f"stopping at step {step}", flush=True)
            break
        time.sleep(args.sleep)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
