"""How often a run will be interrupted, what that costs, and when it ends.

- :func:`failure_rate`: failures per GPU-hour, from this cluster's history
  (the faults recorded under the runs root, over the GPU-hours its runs
  trained on: allocated less the degraded bucket, e.g. spares waiting)
  blended with a published prior: Meta's research clusters, a mean time to
  failure of 7.9 h at 1,024 GPUs (arXiv 2410.21680), i.e. one failure per
  8,090 GPU-hours. The blend is a Gamma-Poisson posterior whose prior
  weighs as one failure: with no history the prior alone; with thousands of
  GPU-hours of history mostly the cluster's own rate. A site that knows its
  own figure sets ``cluster.gpu_h_per_failure``, the prior then.
- :func:`young_daly_interval_s`: the checkpoint interval that minimises
  expected lost time, sqrt(2 x blocking save cost x MTBF) (Young 1974, Daly
  2006), for a job of a given size.
- :func:`forecast`: P50 and P90 wall time to finish a run's remaining work
  under that failure rate: a seeded Monte Carlo over a Poisson failure
  process in which each failure costs the restart and the work since the last
  checkpoint, and every save its blocking cost.

Standard library only; nothing here reads Slurm.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.config.runfiles import FAULTS_FILE
from launcher.config.saveauto import interval_s, interval_steps, steps_value
from launcher.config.schema import RunConfig

# Meta's research clusters (arXiv 2410.21680): MTTF 7.9 h at 1,024 GPUs.
PRIOR_MTTF_H = 7.9
PRIOR_GPUS = 1024
PRIOR_GPU_HOURS_PER_FAILURE = PRIOR_MTTF_H * PRIOR_GPUS
# Runs read for the history, newest first (a root with more is sampled by age).
HISTORY_MAX_RUNS = 2000


@dataclass
class FailureRate:
    per_gpu_hour: float
    faults: int  # in the history
    gpu_hours: float  # of the history
    source: str  # what the figure rests on, for the dry run and the log

    def mtbf_h(self, gpus: int) -> float:
        """Mean hours between failures of a job on ``gpus`` GPUs."""
        return math.inf if self.per_gpu_hour <= 0 else 1.0 / (self.per_gpu_hour * max(1, gpus))


def _trained_gpu_s(doc: dict) -> float:
    """A run's GPU-seconds exposed to the failures that interrupt it: its
    allocation less the degraded bucket (spares waiting, nodes left out),
    whose failures never stop the job; a job's MTBF is this rate times the
    GPUs it trains on."""
    degraded = (doc.get("buckets_gpu_s") or {}).get("degraded") or 0.0
    return max(0.0, float(doc.get("allocated_gpu_s") or 0.0) - float(degraded))


def _history(runs_root: Path) -> tuple[int, float, int]:
    """(faults, allocated GPU-hours, unreadable files) of the runs under the root."""
    faults, gpu_s, bad = 0, 0.0, 0
    goodputs = sorted(runs_root.glob("**/goodput.json"), key=_mtime, reverse=True)[:HISTORY_MAX_RUNS]
    for g in goodputs:
        try:
            doc = json.loads(g.read_text())
            trained = _trained_gpu_s(doc)
        except (OSError, ValueError, TypeError, AttributeError):
            bad += 1
            continue
        if trained <= 0:
            continue  # no GPU trained (a CPU run): its faults are no GPU's
        gpu_s += trained
        try:
            lines = (g.parent / FAULTS_FILE).read_text().splitlines()
        except FileNotFoundError:
            continue
        except OSError:
            bad += 1
            continue
        for line in lines:
            try:
                rec = json.loads(line)
            except ValueError:
                bad += 1
                continue
            # A fault record names its cause; resume records are events.
            if (
                isinstance(rec, dict)
                and "cause" in rec
                and "event" not in rec
                and rec["cause"] != "straggler"
            ):
                faults += 1
    return faults, gpu_s / 3600.0, bad


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0


def prior_gpu_h(gpu_h_per_failure: float) -> tuple[float, str]:
    """(GPU-hours per failure, what it is) of the prior: the site's own figure
    (``cluster.gpu_h_per_failure``) where set, else Meta's."""
    if gpu_h_per_failure > 0:
        return gpu_h_per_failure, f"prior: cluster.gpu_h_per_failure={gpu_h_per_failure:g} GPU-h"
    return (
        PRIOR_GPU_HOURS_PER_FAILURE,
        f"prior: MTTF {PRIOR_MTTF_H:g} h at {PRIOR_GPUS:,} GPUs (Meta, arXiv 2410.21680)",
    )


def failure_rate(runs_root: str | Path | None, gpu_h_per_failure: float = 0.0) -> FailureRate:
    """Failures per GPU-hour for a run under ``runs_root`` (see the module
    docstring); ``gpu_h_per_failure`` > 0 is the site's prior instead of Meta's."""
    prior_h, prior = prior_gpu_h(gpu_h_per_failure)
    faults, hours, bad = _history(Path(runs_root)) if runs_root and Path(runs_root).is_dir() else (0, 0.0, 0)
    rate = (faults + 1.0) / (hours + prior_h)
    source = (
        prior
        if hours <= 0
        else f"{faults} fault(s) in {hours:,.1f} GPU-h under {runs_root}, with the {prior}"
    )
    if bad:
        source += f"; {bad} unreadable history record(s) skipped"
    return FailureRate(rate, faults, hours, source)


def young_daly_interval_s(save_cost_s: float, mtbf_s: float) -> float:
    """sqrt(2 x save cost x MTBF): inf when the job never fails, 0 when saves are free."""
    return interval_s(save_cost_s, mtbf_s)


def planned_save_every_steps(cfg: RunConfig, plan: Any, blocked_s: float, step_s: float) -> int:
    """The save interval the performance model prices: the configured one;
    for ``auto`` the one the plan chose (``plan.save_auto``), else (while
    planning) Young/Daly at the published prior's MTBF: the model reads no
    runs root; launcher/plan/make.py re-prices once the history's figure is in."""
    every = steps_value(cfg.storage.save_every_steps)
    if every is not None:
        return every
    chosen = getattr(plan, "save_auto", None)
    if chosen is not None:
        return chosen.steps
    mtbf_s = prior_gpu_h(cfg.cluster.gpu_h_per_failure)[0] * 3600.0 / max(1, plan.world_size)
    return interval_steps(blocked_s, mtbf_s, step_s, 1, max(1, cfg.train.steps))


@dataclass
class Forecast:
    p50_h: float
    p90_h: float
    expected_failures: float
    samples: int


def forecast(
    work_s: float,
    *,
    mtbf_s: float,
    restart_s: float,
    interval_s: float,
    save_cost_s: float,
    samples: int = 2000,
    seed: int = 0,
) -> Forecast:
    """Wall hours to do ``work_s`` seconds of training steps: saves every
    ``interval_s`` of work cost ``save_cost_s`` each; a failure (exponential
    inter-arrival, mean ``mtbf_s``) costs ``restart_s`` plus the work since the
    last save. Deterministic for a seed."""
    if work_s <= 0:
        return Forecast(0.0, 0.0, 0.0, 0)
    interval_s = min(max(interval_s, 1e-9), work_s)
    rng = random.Random(seed)
    totals: list[float] = []
    failures = 0
    for _ in range(samples):
        t, done = 0.0, 0.0
        while done < work_s:
            chunk = min(interval_s, work_s - done)  # work until the next save
            span = chunk + (save_cost_s if done + chunk < work_s else 0.0)
            ttf = rng.expovariate(1.0 / mtbf_s) if math.isfinite(mtbf_s) and mtbf_s > 0 else math.inf
            if ttf >= span:
                t += span
                done += chunk
            else:  # lost since the last save; restart
                t += ttf + restart_s
                failures += 1
        totals.append(t)
    totals.sort()

    def q(p: float) -> float:
        return totals[min(len(totals) - 1, int(p * len(totals)))] / 3600.0

    return Forecast(q(0.5), q(0.9), failures / samples, samples)
