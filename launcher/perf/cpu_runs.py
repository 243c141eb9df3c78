"""CPU runs measured on this project's build host, used to fit and check
the performance model's CPU constants (``launcher/perf/cpu_runs.yaml``;
``scripts/measure_cpu_runs.py`` measures them with the real trainer)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

RUNS_FILE = Path(__file__).with_name("cpu_runs.yaml")
# metrics.jsonl lines left out as warm-up (first steps allocate and fault in).
WARMUP_STEPS = 2
# Every measured run: a short synthetic-data run, no checkpoint writes, no
# TensorBoard, one metrics line per step.
COMMON = [
    "cluster=local",
    "data=synthetic",
    "train.steps=10",
    "train.log_every_steps=1",
    "train.checkpoint_at_end=false",
    "train.tensorboard=false",
    "storage.save_every_steps=1000000",
]


# The two model sizes (byte vocabulary, seq 256, 8 sequences per step).
SMALL = ["model=tiny", "model.dim=128", "model.ffn_dim=384", "model.seq_len=256", "train.global_batch_size=8"]
LARGE = [
    "model=tiny",
    "model.dim=256",
    "model.n_layers=6",
    "model.n_heads=8",
    "model.n_kv_heads=4",
    "model.ffn_dim=768",
    "model.seq_len=256",
    "train.global_batch_size=8",
]
# Layout choices checked against measured step times: (what, overrides of
# a parallelism=auto run whose planner candidates are the rows, or [] for
# the model's own pick among the rows, row names).
PLANNER_CHECKS: list[tuple[str, list[str], list[str]]] = [
    (
        "planner, parallelism=auto + AC auto, large model, 4 ranks",
        [
            *LARGE,
            "cluster.local_processes=4",
            "parallelism=auto",
            "parallelism.activation_checkpointing=auto",
        ],
        ["L-fsdp4-none", "L-fsdp4-selective", "L-fsdp4-full"],
    ),
    (
        "perf model's fastest of all measured layouts, large model, 4 ranks",
        [],
        [
            "L-fsdp4-none",
            "L-fsdp4-selective",
            "L-fsdp4-full",
            "L-hsdp2x2-none",
            "L-tp2dp2-none",
            "L-pp2dp2-none",
        ],
    ),
    (
        "perf model's fastest of all measured layouts, small model, 2 ranks",
        [],
        ["S-fsdp2-none", "S-fsdp2-full", "S-tp2-none", "S-pp2-none"],
    ),
    ("perf model's fastest, small model, 4 ranks", [], ["S-fsdp4-none", "S-hsdp2x2-none"]),
    ("perf model's fastest, large model, 2 ranks", [], ["L-fsdp2-none", "L-fsdp2-selective"]),
]


def command(overrides: list[str]) -> list[str]:
    """The exact command a row runs (run_dir appended by the measurer)."""
    return [sys.executable, "-m", "launcher", *COMMON, *overrides]


@dataclass
class CpuRun:
    name: str
    split: str  # calibration | held_out
    overrides: list[str]
    step_time_s: float  # measured (0 when not measured yet)
    # Of the repeat the row keeps (its fastest): the 1-minute load average
    # before and after (the run's own ranks included) and the cores other
    # work kept busy meanwhile (None where not recorded).
    load_avg: list[float]
    others_cores: float | None
    command: str


def load_runs(path: Path = RUNS_FILE) -> list[CpuRun]:
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    out = []
    for r in data["runs"]:
        m = r.get("measured") or {}
        kept = min(m.get("repeats") or [{}], key=lambda rep: rep.get("step_time_s", 0.0))
        out.append(
            CpuRun(
                r["name"],
                r["split"],
                list(r["overrides"]),
                float(m.get("step_time_s", 0.0)),
                list(kept.get("load_avg_1m", [])),
                kept.get("others_cores"),
                r.get("command", ""),
            )
        )
    return out


def host_peak(path: Path = RUNS_FILE) -> dict[str, Any]:
    """The matmul probe of the host the rows were measured on."""
    data = yaml.safe_load(path.read_text())
    return data["host"]
