"""Refit calibration parameters to the step times of real runs (the command:
``python -m launcher.calibrate``, launcher/commands/calibrate.py).

Each run directory holds ``spec.json`` (config + plan) and ``metrics.jsonl``;
the measured step time is the median ``step_time_s`` after the warm-up
lines. Each chosen parameter is scaled (log space, golden-section search,
a few coordinate-descent rounds) to minimise the mean squared log error
between predicted and measured step times. Dotted names reach nested
entries (``gpus.H100.matmul_efficiency``, ``fabric_efficiency.ib_hdr``);
names joined by ``|`` are one parameter (set to the same value), e.g. the
matmul efficiency of every Hopper part.
"""

from __future__ import annotations

import copy
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.config.runfiles import METRICS_FILE
from launcher.config.validate import ConfigError
from launcher.perf.params import PerfParams
from launcher.perf.steptime import predict

GOLDEN = (math.sqrt(5) - 1) / 2
# What a fit on CPU runs adjusts (the peak itself is measured): the matmul
# efficiency of each precision (fp32 and bf16 kernels reach different shares
# of their own peaks), the loopback link and the fixed cost per step. Not
# the per-block cost: with it the efficiency runs to its bound of 1.
CPU_PARAMS = (
    "cpu_matmul_efficiency",
    "cpu_bf16_matmul_efficiency",
    "cpu_step_overhead_s",
    "cpu_link_gb_per_s",
)


@dataclass
class Measured:
    run_dir: str  # or another name of the measurement
    cfg: Any
    plan: Any  # a Layout (launcher/config/plandata.py); a Plan is one
    step_time_s: float
    steps: int
    # How the measured run differs from meshrun's trainer (predict kwargs:
    # float8, selective_matmul_recompute), for published runs.
    predict_kw: dict[str, Any] = field(default_factory=dict)


def read_metrics(path: Path, skip: int = 1) -> list[float]:
    """step_time_s of logged steps, the first ``skip`` (warm-up) left out."""
    times = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            rec = json.loads(line)
            if "event" not in rec and rec.get("step_time_s"):
                times.append(float(rec["step_time_s"]))
    return times[skip:] if len(times) > skip else times


def load_run(run_dir: str | Path, skip: int = 1) -> Measured:
    from launcher.config.runfiles import SPEC_FILE
    from launcher.config.spec import load_spec

    run_dir = Path(run_dir)
    metrics = run_dir / METRICS_FILE
    if not (run_dir / SPEC_FILE).is_file() or not metrics.is_file():
        raise ConfigError(f"run dir {str(run_dir)!r} needs spec.json and metrics.jsonl")
    times = read_metrics(metrics, skip)
    if not times:
        raise ConfigError(f"{metrics}: no step_time_s records")
    spec = load_spec(run_dir)
    return Measured(str(run_dir), spec.cfg, spec.plan, statistics.median(times), len(times))


def _get(p: PerfParams, name: str) -> float:
    name = name.split("|")[0]
    obj: Any = p
    for part in name.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return float(obj)


def _set(p: PerfParams, name: str, value: float) -> None:
    for one in name.split("|"):
        _set_one(p, one, value)


def _set_one(p: PerfParams, name: str, value: float) -> None:
    parts = name.split(".")
    obj: Any = p
    for part in parts[:-1]:
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    if isinstance(obj, dict):
        obj[parts[-1]] = value
    else:
        setattr(obj, parts[-1], value)


def predicted_step(run: Measured, p: PerfParams) -> float:
    pred = predict(run.cfg, run.plan, p, **run.predict_kw)
    # Median step times leave out the occasional save; so does this.
    return pred.step_time_s - pred.breakdown["checkpoint"]


def loss(runs: list[Measured], p: PerfParams) -> float:
    return sum(math.log(predicted_step(r, p) / r.step_time_s) ** 2 for r in runs) / len(runs)


def cpu_params(runs: list[Measured]) -> list[str]:
    """The CPU constants ``runs`` can determine: a precision's efficiency
    only when some run is of that precision (else the fit has nothing to
    move it by)."""
    bf16 = {r.plan.precision == "bf16" for r in runs}
    skip = {"cpu_matmul_efficiency"} if False not in bf16 else set()
    if True not in bf16:
        skip.add("cpu_bf16_matmul_efficiency")
    return [n for n in CPU_PARAMS if n not in skip]


def default_params(runs: list[Measured], p: PerfParams) -> list[str]:
    if all(r.plan.device == "cpu" for r in runs):
        return cpu_params(runs)
    keys = sorted({next(k for k, v in p.gpus.items() if v is p.gpu(r.cfg.cluster.gpu_type)) for r in runs})
    return [f"gpus.{k}.matmul_efficiency" for k in keys] + ["block_overhead_s"]


def _bounded(name: str, value: float) -> float:
    """Efficiencies are shares of a peak: at most 1."""
    return min(value, 1.0) if name.endswith("efficiency") else value


def fit(
    runs: list[Measured],
    p: PerfParams,
    names: list[str],
    rounds: int = 4,
    span: float = 10.0,
    label: str = "",
) -> PerfParams:
    """A copy of ``p`` with ``names`` scaled to fit ``runs`` (``label``
    names them in the provenance; default: the run list)."""
    p = copy.deepcopy(p)
    for name in names:
        for one in name.split("|"):
            _get(p, one)  # unknown names fail before any work
    for _ in range(rounds):
        for name in names:
            x0 = _get(p, name)
            if x0 <= 0:
                x0 = 1e-6

            def f(logk: float, name=name, x0=x0) -> float:
                _set(p, name, _bounded(name, x0 * math.exp(logk)))
                return loss(runs, p)

            a, b = -math.log(span), math.log(span)
            c, d = b - GOLDEN * (b - a), a + GOLDEN * (b - a)
            fc, fd = f(c), f(d)
            for _ in range(40):
                if fc < fd:
                    b, d, fd = d, c, fc
                    c = b - GOLDEN * (b - a)
                    fc = f(c)
                else:
                    a, c, fc = c, d, fd
                    d = a + GOLDEN * (b - a)
                    fd = f(d)
            _set(p, name, _bounded(name, x0 * math.exp((a + b) / 2)))
    kind = "cpu" if all(r.plan.device == "cpu" for r in runs) else "gpu"
    label = label or ", ".join(r.run_dir for r in runs)
    p.provenance = {**p.provenance, kind: f"fit: {', '.join(n.split('|')[0] for n in names)} on {label}"}
    return p
