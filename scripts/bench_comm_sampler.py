"""Loop-thread cost of the collective sampler (train/observe/commsample.py), side by
side: the old way (profiler on for a whole log interval, then
``prof.events()`` parsed on the loop thread) against the current one
(profiler on for one step; the loop only stops it, the raw trace is read by
another thread). One gloo rank, a small MLP with all-reduced gradients, CPU.

    PYTHONPATH=. python scripts/bench_comm_sampler.py [--interval 50]
    PYTHONPATH=. python scripts/bench_comm_sampler.py --quick   # seconds (CI)

What is timed: the training loop's own wall time, not one call. Each way
runs real steps and the time the loop loses is its elapsed time minus the
same number of unprofiled steps (the median step of a baseline run before
each): for the old way, the profiled interval's steps, stopping the profiler
and the parse; for the new way, starting and stopping the profiler, the
profiled step, and every step the loop runs while the reader thread parses
the trace beside it (it competes for the GIL and the cores), until the
summary is picked up; the new way is repeated (``--repeats``, median). Last
line: ``bench_comm_sampler: old_over_new=R``, the loop time the old way adds
over the time the new way adds (each printed signed: a negative one means
the run was within the baseline's noise, and then there is no ratio).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from train.observe.commsample import CollectiveSampler, summarize_collectives

# --quick: a 10-step window and fewer baseline steps and repeats, the same two ways.
QUICK = {"interval": 10, "baseline_steps": 10, "repeats": 3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--interval", type=int, default=50, help="log interval in steps (the old window)")
    ap.add_argument("--baseline-steps", type=int, default=30, help="unprofiled steps timed before each way")
    ap.add_argument("--repeats", type=int, default=5, help="windows of the new way (median reported)")
    ap.add_argument("--quick", action="store_true", help="small sizes: seconds (CI)")
    args = ap.parse_args()
    if args.quick:  # re-parsed so that options given explicitly still win
        ap.set_defaults(**QUICK)
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

            def baseline_step_s() -> float:
                times = []
                for _ in range(args.baseline_steps):
                    t = time.perf_counter()
                    step()
                    times.append(time.perf_counter() - t)
                return statistics.median(times)

            for _ in range(3):
                step()

            # Old: the whole interval profiled, parsed on the loop thread.
            base_old = baseline_step_s()
            t = time.perf_counter()
            prof = profile(activities=[ProfilerActivity.CPU])
            prof.__enter__()
            for _ in range(args.interval):
                step()
            prof.__exit__(None, None, None)
            events = prof.events()
            summarize_collectives([(e.name, e.cpu_time_total) for e in events if e.name.startswith("gloo:")])
            old = time.perf_counter() - t - args.interval * base_old

            # New: one profiled step; the loop keeps stepping while the reader
            # parses, until on_update returns the summary. Cheap, so repeated
            # (each against its own baseline); the median is reported.
            news, steps_each, bases = [], [], []
            for _ in range(args.repeats):
                sampler = CollectiveSampler(every=1, cuda=False)
                sampler.on_update(1)
                sampler.on_update(2)  # arms the window
                base_new = baseline_step_s()
                t = time.perf_counter()
                sampler.step_begin(1)
                step()
                sampler.step_end(1)
                steps, summary = 1, None
                while summary is None:
                    step()
                    steps += 1
                    summary = sampler.on_update(steps + 1)
                news.append(time.perf_counter() - t - steps * base_new)
                steps_each.append(steps)
                bases.append(base_new)
            new = statistics.median(news)
        finally:
            dist.destroy_process_group()
    load = os.getloadavg()[0]
    print(
        f"old: loop lost {old:+.3f} s over {args.interval} steps ({args.interval}-step window, "
        f"{len(events)} events parsed on the loop; unprofiled step {base_old * 1e3:.2f} ms)"
    )
    print(
        f"new: loop lost {new:+.4f} s, median of {args.repeats} windows "
        f"({', '.join(f'{x:+.4f} s over {n} steps' for x, n in zip(news, steps_each, strict=True))}; "
        f"1-step window; {sampler.last_events_read} raw events read beside the loop; unprofiled step "
        f"{statistics.median(bases) * 1e3:.2f} ms)"
    )
    print(f"host: load average {load:.1f} on {os.cpu_count()} CPUs")
    ratio = f"{old / new:.1f}" if new > 0 else "n/a (the new way lost no measurable loop time)"
    print(f"bench_comm_sampler: old_over_new={ratio}")


if __name__ == "__main__":
    main()
