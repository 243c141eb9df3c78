"""Checkpoint drill: a small deterministic training loop that uses
CheckpointManager exactly as the trainer does. Checkpoint tests of the
protocol (S3 outages, resharding, corruption) and ``scripts/bench_checkpoint.py``
run it (a harness, kept out of the runtime packages; the kill trials drive
the real trainer);
it trains an FSDP2-sharded MLP whose loss at each step depends only on the
step (data are a function of the step), so a resumed run must reproduce an
uninterrupted run's losses exactly.

    python scripts/ckpt_drill.py <run_dir> [--step-sleep-s S]

Ranks come from the usual environment (RANK/WORLD_SIZE/MASTER_ADDR/...).
Rank 0 appends ``{"step", "loss"}`` lines to ``<run_dir>/drill_losses.jsonl``
and ``{"resumed": step}`` to ``<run_dir>/drill_resumes.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

from launcher.config.spec import load_spec  # noqa: E402
from train.checkpoint.manager import CheckpointManager  # noqa: E402
from train.parallel.dist import dist_info_from_env  # noqa: E402


class _Data:
    """Deterministic batches: global batch of step s from a seed; each rank
    takes its slice, so any world size sees the same global batch."""

    def __init__(self, dim: int, global_batch: int, rank: int, world: int, seed: int):
        self.dim, self.gb, self.rank, self.world, self.seed = dim, global_batch, rank, world, seed
        self.step = 0

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.step += 1
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.step)
        x = torch.randn(self.gb, self.dim, generator=g)
        y = torch.randn(self.gb, self.dim, generator=g)
        per = self.gb // self.world
        return x[self.rank * per : (self.rank + 1) * per], y[self.rank * per : (self.rank + 1) * per]

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])


class _Scheduler:
    def __init__(self, sched: torch.optim.lr_scheduler.LRScheduler):
        self.sched = sched

    def state_dict(self) -> dict:
        return self.sched.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.sched.load_state_dict(state)


def build_model(dim: int, layers: int, world: int) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(dim, dim), nn.Tanh())])
    if world > 1:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    return model


def _append(run_dir: str, name: str, record: dict) -> None:
    with open(os.path.join(run_dir, name), "a") as f:
        f.write(json.dumps(record) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--step-sleep-s", type=float, default=0.0)
    ap.add_argument("--layers", type=int, default=2)
    args = ap.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr
    )
    spec = load_spec(args.run_dir)
    info = dist_info_from_env("cpu")
    if info.world_size > 1:
        dist.init_process_group("gloo", rank=info.rank, world_size=info.world_size)
    from train.loop.state import ModelState, OptimState, Progress, RNGState

    tc = spec.cfg.train
    dim = spec.cfg.model.dim
    model = build_model(dim, args.layers, info.world_size)
    opt = torch.optim.AdamW(model.parameters(), lr=tc.lr, weight_decay=tc.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, tc.warmup_steps)))
    data = _Data(dim, 8, info.rank, info.world_size, tc.seed)
    progress = Progress()
    torch.manual_seed(tc.seed)  # same RNG stream on every rank
    app_state = {
        "model": ModelState([model]),
        "optim": OptimState([model], [opt]),
        "lr_scheduler": _Scheduler(sched),
        "data": data,
        "rng": RNGState(),
        "progress": progress,
    }
    ckpt = CheckpointManager(spec, info)
    start = ckpt.resume(app_state)
    assert start == progress.step == data.step, (start, progress.step, data.step)
    if info.rank == 0:
        _append(
            args.run_dir,
            "drill_resumes.jsonl",
            {"resumed": start, "pid": os.getpid(), "world": info.world_size},
        )
    for step in range(start + 1, tc.steps + 1):
        x, y = data.next()
        # A draw from the (checkpointed) RNG enters the loss: a resume that
        # lost the RNG state would not reproduce the losses.
        x = x * (1.0 + 0.1 * torch.rand(()))
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        if info.world_size > 1:
            loss = loss.detach().clone()
            dist.all_reduce(loss)
            loss /= info.world_size
        progress.step = step
        if info.rank == 0:
            _append(args.run_dir, "drill_losses.jsonl", {"step": step, "loss": loss.item()})
        if ckpt.should_save(step, final=step == tc.steps):
            ckpt.save(step, app_state)
        if args.step_sleep_s:
            time.sleep(args.step_sleep_s)
    report = ckpt.finalize()
    if info.rank == 0:
        with open(os.path.join(args.run_dir, "drill_report.json"), "w") as f:
            json.dump(report, f)
    if info.world_size > 1:
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
