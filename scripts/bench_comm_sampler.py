"""Loop-thread cost of the collective sampler (train/metrics.py), side by
side: the old way (profiler on for a whole log interval, then
``prof.events()`` parsed on the loop thread) against the current one
(profiler on for one step; the loop only stops it, the raw trace is read by
another thread). One gloo rank, a small MLP with all-reduced gradients, CPU.

    PYTHONPATH=. python scripts/bench_comm_sampler.py [--interval 50]

Last line: ``bench_comm_sampler: old_over_new=R`` (loop block, old / new).
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from train.commsample import CollectiveSampler, summarize_collectives


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--interval", type=int, default=50, help="log interval in steps (the old window)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=0, world_size=1)
        try:
            model = torch.nn.Sequential(*[torch.nn.Linear(128, 128) for _ in range(8)])
            opt = torch.optim.AdamW(model.parameters())

            def step() -> None:
                model(torch.randn(8, 128)).pow(2).mean().backward()
                for p in model.parameters():
                    dist.all_reduce(p.grad)
                opt.step()
                opt.zero_grad()

            for _ in range(3):
                step()
            prof = profile(activities=[ProfilerActivity.CPU])
            prof.__enter__()
            for _ in range(args.interval):
                step()
            t = time.perf_counter()
            prof.__exit__(None, None, None)
            events = prof.events()
            summarize_collectives([(e.name, e.cpu_time_total) for e in events if e.name.startswith("gloo:")])
            old = time.perf_counter() - t

            sampler = CollectiveSampler(every=1, cuda=False)
            sampler.on_update(1)
            sampler.on_update(2)  # arms the window
            sampler.step_begin(1)
            step()
            t = time.perf_counter()
            sampler.step_end(1)
            new = time.perf_counter() - t
            sampler.wait_read()
        finally:
            dist.destroy_process_group()
    print(
        f"old: loop blocked {old:.3f} s ({args.interval}-step window, {len(events)} events parsed on the loop)"
    )
    print(
        f"new: loop blocked {new:.4f} s (1-step window; {sampler.last_events_read} raw events read off the loop)"
    )
    print(f"bench_comm_sampler: old_over_new={old / new:.0f}")


if __name__ == "__main__":
    main()
