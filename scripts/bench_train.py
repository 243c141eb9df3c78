#!/usr/bin/env python
"""Training throughput on the GPUs present: tokens/s (per GPU), MFU and peak
memory for one model and layout, across variants (bf16; torch.compile on and
off; activation checkpointing none / selective / full). Each variant is a
real run through the launcher's local path (``python -m train`` on every
GPU), so the figures are what a user's run gets.

    python scripts/bench_train.py model=1b                       # all variants
    python scripts/bench_train.py model=8b --variants bf16,bf16+compile
    python scripts/bench_train.py model=tiny --allow-cpu --steps 6  # smoke test
    python scripts/bench_train.py --quick   # seconds (CI)

``--quick``: model=tiny, 3 steps, two variants (bf16, bf16+ac_full) side
by side, on the GPUs present or else one CPU rank of one thread; overrides
given still win.

Beside each measured row: the performance model's prediction for the same
plan (``pred tok/s/gpu``, ``pred MFU``: launcher/perf/steptime.py) and, with
``--host-syncs``, the host syncs per step (train.host_sync_check=count,
train/observe/hostsync.py: the reads of the device a step made, its logging
read included, so 1 is the floor of a step that logs).

Prints a table, then one JSON line (``bench_train: {...}``).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from launcher.config.compose import compose  # noqa: E402
from launcher.config.spec import RunSpec, save_spec  # noqa: E402
from launcher.perf import predict  # noqa: E402
from launcher.plan.make import make_plan  # noqa: E402
from launcher.run.local import run_local, use_local_gpus  # noqa: E402

# name -> (precision, compile, activation_checkpointing, train.float8)
VARIANTS = {
    "bf16": ("bf16", False, "none", "off"),
    "bf16+compile": ("bf16", True, "none", "off"),
    "bf16+ac_selective": ("bf16", False, "selective", "off"),
    "bf16+ac_full": ("bf16", False, "full", "off"),
    "bf16+compile+ac_selective": ("bf16", True, "selective", "off"),
    # torchtitan's float8 rows run compiled (the casts fuse); FP8 GPUs only.
    "bf16+compile+float8": ("bf16", True, "none", "tensorwise"),
    "bf16+compile+float8_rowwise": ("bf16", True, "none", "rowwise"),
}


def variant_config(base, name: str, steps: int, host_syncs: bool = False):
    """The run config of one variant of ``base``."""
    precision, compiled, ac, float8 = VARIANTS[name]
    cfg = copy.deepcopy(base)
    cfg.train.float8 = float8
    cfg.parallelism.precision, cfg.parallelism.compile, cfg.parallelism.activation_checkpointing = (
        precision,
        compiled,
        ac,
    )
    cfg.train.steps, cfg.train.log_every_steps, cfg.train.checkpoint_at_end = steps, 1, False
    cfg.storage.save_every_steps = 10**6
    # Not under compile: the watch cannot be traced (launcher/config/validate.py).
    cfg.train.host_sync_check = "count" if host_syncs and not compiled else "off"
    return cfg


def run_variant(base, name: str, steps: int, work: str, host_syncs: bool = False) -> dict:
    cfg = variant_config(base, name, steps, host_syncs)
    row: dict = {"variant": name}
    try:
        plan = make_plan(cfg)
    except ValueError as e:
        return {**row, "error": f"plan: {e}"}
    try:
        pred = predict(cfg, plan)
        row.update(pred_tokens_per_s_per_gpu=pred.tokens_per_s_per_gpu, pred_mfu=pred.mfu)
    except ValueError as e:  # no peak to predict with (e.g. an unknown GPU type)
        row["pred_error"] = str(e)
    run_dir = Path(tempfile.mkdtemp(prefix=f"bench-{name}-", dir=work))
    spec = RunSpec(cfg=cfg, plan=plan, run_dir=str(run_dir))
    save_spec(spec)
    t0 = time.perf_counter()
    code = run_local(spec, echo=None)
    row["wall_s"] = round(time.perf_counter() - t0, 1)
    if code:
        tail = (run_dir / "logs" / "rank0.log").read_text().strip().splitlines()[-3:]
        return {**row, "error": f"exit {code}: {' / '.join(tail)}"[:400]}
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps_ = [r for r in recs if "event" not in r]
    # Skip warm-up (first collectives, compilation, allocator growth).
    steady = steps_[len(steps_) // 3 :] or steps_
    row.update(
        layout=" x ".join(f"{k}={v}" for k, v in plan.mesh_dims().items() if v > 1) or "1 rank",
        world_size=plan.world_size,
        tokens_per_step=plan.tokens_per_step,
        micro_batch_size=plan.micro_batch_size,
        grad_accum_steps=plan.grad_accum_steps,
        step_time_s=statistics.median(r["step_time_s"] for r in steady),
        tokens_per_s=statistics.median(r["tokens_per_s"] for r in steady),
        tokens_per_s_per_gpu=statistics.median(r["tokens_per_s_per_gpu"] for r in steady),
        mfu=statistics.median(r["mfu"] for r in steady),
        peak_mem_gb=max(r["peak_mem_gb"] for r in steps_),
        final_loss=steps_[-1]["loss"],
    )
    if cfg.train.host_sync_check == "count":  # every step logs: its count is host_syncs_logging_step
        row["host_syncs_per_step"] = max(r.get("host_syncs_logging_step", 0) for r in steady)
    return row


def _row_line(name: str, row: dict) -> str:
    if "error" in row:
        return f"{name:<28} FAILED {row['error']}"
    pred_tps, pred_mfu = row.get("pred_tokens_per_s_per_gpu"), row.get("pred_mfu")
    syncs = row.get("host_syncs_per_step")
    return (
        f"{name:<28} {row['layout']:<16} {row['tokens_per_s']:>10,.0f} "
        f"{row['tokens_per_s_per_gpu']:>10,.0f} {row['mfu'] * 100:>6.1f} "
        + (f"{pred_tps:>10,.0f} {pred_mfu * 100:>6.1f} " if pred_tps is not None else f"{'-':>10} {'-':>6} ")
        + f"{row['step_time_s']:>7.3f} {row['peak_mem_gb']:>8.1f} "
        + (f"{syncs:>6}" if syncs is not None else f"{'-':>6}")
        + f" {row['wall_s']:>7.0f}"
    )


# --quick: the fewest variants that still compare, on the smallest model and one rank.
QUICK = {"variants": "bf16,bf16+ac_full", "steps": 3, "allow_cpu": True, "host_syncs": True}
QUICK_OVERRIDES = ["model=tiny", "cluster.local_processes=1"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=1b train.global_batch_size=8")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, from {list(VARIANTS)}")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--allow-cpu", action="store_true", help="run on CPU ranks when no GPU is present")
    ap.add_argument("--json", default="", help="also write the rows to this file")
    ap.add_argument(
        "--host-syncs", action="store_true", help="count host syncs per step (train.host_sync_check=count)"
    )
    ap.add_argument("--quick", action="store_true", help="tiny model, 2 variants, 3 steps: seconds (CI)")
    args = ap.parse_args()
    if args.quick:  # re-parsed so that options given explicitly still win
        ap.set_defaults(**QUICK)
        args = ap.parse_args()
        args.overrides = [*QUICK_OVERRIDES, *args.overrides]
        # One intra-op thread: on a shared CPU host two threads a rank spin
        # against other processes and a tiny step takes seconds, not ms.
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    names = [v for v in args.variants.split(",") if v]
    bad = [v for v in names if v not in VARIANTS]
    if bad:
        ap.error(f"unknown variants {bad}; choose from {list(VARIANTS)}")
    base = compose(["cluster=local", *args.overrides])
    use_local_gpus(base.cluster)
    if base.cluster.gpus_per_node == 0 and not args.allow_cpu:
        print("bench_train: no GPU found (nvidia-smi); pass --allow-cpu for a CPU smoke run", file=sys.stderr)
        return 2
    device = (
        f"{base.cluster.gpus_per_node} x {base.cluster.gpu_type}" if base.cluster.gpus_per_node else "CPU"
    )
    print(f"bench_train: model={base.model.name} on {device}, {args.steps} steps per variant")
    print(
        f"{'variant':<28} {'layout':<16} {'tok/s':>10} {'tok/s/gpu':>10} {'MFU %':>6} "
        f"{'pred tok/s':>10} {'pred %':>6} {'step s':>7} {'peak GB':>8} {'syncs':>6} {'wall s':>7}"
    )
    if args.host_syncs and any(VARIANTS[n][1] for n in names):
        print(
            "bench_train: host syncs are not counted on compiled variants (torch.compile cannot trace the watch)"
        )
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_train-") as work:
        for name in names:
            row = run_variant(base, name, args.steps, work, args.host_syncs)
            rows.append(row)
            print(_row_line(name, row), flush=True)
    summary = {
        "model": base.model.name,
        "device": device,
        "gpu_peak_bf16_tflops": base.cluster.gpu_peak_bf16_tflops,
    }
    summary["rows"] = rows
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    print("bench_train: " + json.dumps(summary))
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
