"""What a run reports: progress lines on rank 0's stdout, metrics.jsonl,
result.json (layout in docs/CONTRACTS.md), and the throughput figures
(tokens/s, MFU, peak memory) they carry."""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

import torch

from launcher.config.runfiles import RESULT_FILE
from launcher.config.spec import RunSpec


def peak_mem_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    # CPU: the process's peak resident set (ru_maxrss is KiB on Linux).
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def device_peak_tflops(spec: RunSpec) -> float:
    """One rank's peak, what its logged MFU is a share of: the cluster's GPU
    bf16 peak, or on CPU the measured peak the performance model uses (the
    planner's host probe, recorded in the plan: ``Plan.cpu_rank_peak_gflops``),
    so that ``python -m launcher.predict`` and metrics.jsonl state MFU against
    the same figure. 0.0 (no MFU logged) when there is none."""
    plan = spec.plan
    if plan.device != "cpu":
        return plan.gpu_peak_bf16_tflops
    if plan.cpu_rank_peak_gflops <= 0:
        print("meshrun train: no CPU peak in the plan, MFU not logged", file=sys.stderr, flush=True)
        return 0.0
    return plan.cpu_rank_peak_gflops / 1e3


_said_above_peak: list[bool] = []


def mfu(tokens_per_s_per_gpu: float, flops_per_token: float, peak_tflops: float) -> float:
    """Model FLOPs utilization; 0.0 (not shown) when the device's peak is
    unknown, or when the measured rate is above it: then the peak is too low
    (a CPU probe measured on a busy host, or attention kernels that skip the
    causal mask's FLOPs), and no figure over 100% is logged; said once."""
    if peak_tflops <= 0:
        return 0.0
    ratio = tokens_per_s_per_gpu * flops_per_token / (peak_tflops * 1e12)
    if ratio <= 1.0:
        return ratio
    if not _said_above_peak:
        _said_above_peak.append(True)
        print(
            f"meshrun train: {tokens_per_s_per_gpu * flops_per_token / 1e9:,.1f} GFLOP/s per rank is above the "
            f"device peak {peak_tflops * 1e3:,.1f} GFLOP/s the plan states: MFU not logged (the peak is too low)",
            file=sys.stderr,
            flush=True,
        )
    return 0.0


class RunLog:
    def __init__(self, spec: RunSpec, is_main: bool, out=sys.stdout) -> None:
        self.spec = spec
        self.is_main = is_main
        self.out = out
        self.path = Path(spec.metrics_path)
        self.exporter = None
        self.tracker = None
        if is_main:
            from train.observe.tracking import Tracker

            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.tracker = Tracker(spec, is_main, out)

    def attach_exporter(self, exporter) -> None:
        self.exporter = exporter

    def event(self, name: str, **fields) -> None:
        if self.is_main:
            self._append({"event": name, **fields, "time": time.time()})
            if self.tracker is not None:
                self.tracker.event(name, fields)

    def step(self, metrics: dict) -> None:
        if not self.is_main:
            return
        record = {**metrics, "time": time.time()}
        self._append(record)
        if self.exporter is not None:
            self.exporter.update(record)
        if self.tracker is not None:
            self.tracker.step(metrics)
        steps = self.spec.cfg.train.steps
        mfu_part = f" | mfu {metrics['mfu'] * 100:.1f}%" if metrics["mfu"] else ""
        self.print(
            f"step {metrics['step']}/{steps} | loss {metrics['loss']:.4f} | lr {metrics['lr']:.2e} | "
            f"grad norm {metrics['grad_norm']:.3f} | {metrics['tokens_per_s']:,.0f} tok/s{mfu_part} | "
            f"step {metrics['step_time_s'] * 1e3:.0f} ms | data wait {metrics['data_wait_s'] * 1e3:.1f} ms | "
            f"peak mem {metrics['peak_mem_gb']:.2f} GB"
        )

    def print(self, line: str) -> None:
        if self.is_main:
            print(line, file=self.out, flush=True)

    def result(self, final_step: int, final_loss: float | None, status: str, **extra) -> None:
        if not self.is_main:
            return
        if self.tracker is not None:
            self.tracker.close()  # flush event files before the run reports done
        path = Path(self.spec.run_dir) / RESULT_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(
            json.dumps({"final_step": final_step, "final_loss": final_loss, "status": status, **extra})
        )
        os.replace(tmp, path)

    def _append(self, record: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
