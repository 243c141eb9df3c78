"""Run tracking for the usual experiment tools, written by rank 0 only.

- TensorBoard (``train.tensorboard``, on by default): event files in
  ``<run_dir>/tensorboard/``; ``tensorboard --logdir runs/`` shows every run
  (a sweep's points side by side). A restart appends a new event file to the
  same directory, so the curves continue.
- Weights & Biases (``train.wandb``: off by default; ``online`` needs a
  ``wandb login`` / ``WANDB_API_KEY``, ``offline`` writes ``<run_dir>/wandb/``
  to ``wandb sync`` later). One W&B run per meshrun run dir: a restart resumes
  the same W&B run (its id is derived from the run dir).

Scalars (same names in both): ``train/loss``, ``train/lr``,
``train/grad_norm``, ``perf/tokens_per_s``, ``perf/tokens_per_s_per_gpu``,
``perf/mfu``, ``perf/step_time_s``, ``perf/data_wait_s``,
``perf/data_wait_pct``, ``perf/peak_mem_gb``, ``checkpoint/stall_s`` (at
the step of the save). A tracker that fails to start is reported once on
rank 0's output and never stops training.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from launcher.config.spec import RunSpec

# metrics.jsonl key -> tracked scalar name
STEP_TAGS = {
    "loss": "train/loss",
    "lr": "train/lr",
    "grad_norm": "train/grad_norm",
    "tokens_per_s": "perf/tokens_per_s",
    "tokens_per_s_per_gpu": "perf/tokens_per_s_per_gpu",
    "mfu": "perf/mfu",
    "step_time_s": "perf/step_time_s",
    "data_wait_s": "perf/data_wait_s",
    "data_wait_pct": "perf/data_wait_pct",
    "peak_mem_gb": "perf/peak_mem_gb",
}
# checkpoint event key -> scalar (the loop's stall for that save)
CHECKPOINT_TAGS = {"save_s": "checkpoint/stall_s"}
TB_DIR = "tensorboard"
WANDB_DIR = "wandb"


def wandb_run_id(run_dir: str) -> str:
    """Stable per run dir, so a requeued job logs into the same W&B run."""
    return "meshrun-" + hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]


def _scalars(record: dict[str, Any], tags: dict[str, str]) -> dict[str, float]:
    out = {}
    for key, tag in tags.items():
        v = record.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[tag] = float(v)
    return out


class Tracker:
    """TensorBoard and optional W&B for one run; every method is a no-op
    unless ``is_main``."""

    def __init__(self, spec: RunSpec, is_main: bool, out=sys.stdout) -> None:
        self.tb = None
        self.wandb_run = None
        if not is_main:
            return
        tc, run_dir = spec.cfg.train, Path(spec.run_dir)
        if tc.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(log_dir=str(run_dir / TB_DIR))
            except Exception as e:  # tracking must never stop a run
                print(f"tracking: TensorBoard off ({type(e).__name__}: {e})", file=out, flush=True)
        if tc.wandb != "off":
            try:
                import wandb

                (run_dir / WANDB_DIR).mkdir(parents=True, exist_ok=True)
                self.wandb_run = wandb.init(
                    project=tc.wandb_project,
                    entity=tc.wandb_entity or None,
                    name=f"{run_dir.parent.name}/{run_dir.name}",  # e.g. tiny-local/<time>, <sweep>/3
                    id=wandb_run_id(spec.run_dir),
                    resume="allow",
                    dir=str(run_dir),
                    mode=tc.wandb,
                    config=_flat_config(spec),
                    settings=wandb.Settings(console="off"),
                )
            except Exception as e:
                print(f"tracking: W&B off ({type(e).__name__}: {e})", file=out, flush=True)

    def _log(self, step: int, scalars: dict[str, float]) -> None:
        if not scalars:
            return
        if self.tb is not None:
            for tag, value in scalars.items():
                self.tb.add_scalar(tag, value, global_step=step)
        if self.wandb_run is not None:
            self.wandb_run.log(scalars, step=step)

    def step(self, metrics: dict[str, Any]) -> None:
        self._log(int(metrics["step"]), _scalars(metrics, STEP_TAGS))

    def event(self, name: str, fields: dict[str, Any]) -> None:
        if name == "checkpoint" and isinstance(fields.get("step"), int):
            self._log(fields["step"], _scalars(fields, CHECKPOINT_TAGS))

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
            self.tb = None
        if self.wandb_run is not None:
            self.wandb_run.finish()
            self.wandb_run = None


def _flat_config(spec: RunSpec) -> dict[str, Any]:
    """The composed config and the plan's layout, for W&B's run table."""
    cfg = asdict(spec.cfg)
    cfg["plan"] = {
        k: getattr(spec.plan, k)
        for k in ("world_size", "nodes", "mode", "dp_replicate", "dp_shard", "tp", "pp", "global_batch_size")
    }
    return cfg
