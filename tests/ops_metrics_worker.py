"""A small real training job for the metrics tests: FSDP2 over gloo ranks,
each rank exporting with train.observe.metrics.MetricsExporter. Started by the tests
with torchrun-style variables; keeps serving until <run_dir>/stop exists."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from launcher.config.spec import load_spec
from train.observe.metrics import MetricsExporter
from train.parallel.dist import dist_info_from_env, init_process_group


def main(run_dir: str, steps: int) -> None:
    spec = load_spec(run_dir)
    info = dist_info_from_env("cpu")
    init_process_group(info, timeout_s=120)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    exporter = MetricsExporter(spec, info, comm_sample_every=2)
    batch, tokens = 16, 16 * 256
    for step in range(1, steps + 1):
        exporter.step_begin(step)
        t0 = time.perf_counter()
        x = torch.randn(batch, 256)
        t_data = time.perf_counter() - t0
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        extra = torch.ones(1 << 14)
        dist.all_reduce(extra)  # a plain all-reduce too, as a loss average would
        dt = time.perf_counter() - t0
        exporter.step_end(step)
        exporter.update(
            {
                "step": step,
                "loss": float(loss),
                "lr": 1e-3,
                "step_time_s": dt,
                "tokens_per_s": tokens * info.world_size / dt,
                "tokens_per_s_per_gpu": tokens / dt,
                "mfu": 0.0,
                "data_wait_s": t_data,
                "data_wait_pct": 100.0 * t_data / dt,
            }
        )
        if step == steps // 2:
            exporter.update({"event": "checkpoint", "step": step, "stall_s": 0.05, "upload_lag_s": 1.5})
    print(f"rank {info.rank} serving on {exporter.address}", flush=True)
    stop = Path(run_dir) / "stop"
    end = time.monotonic() + 120
    while not stop.exists() and time.monotonic() < end:
        time.sleep(0.2)
    exporter.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
