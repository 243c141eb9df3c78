"""Checks of the performance model against measurements it was not fitted
to (docs/perf-validation.md is written from :func:`report`).

Two kinds of rows, each split into a calibration set (what
``launcher.perf.calibrate`` fits the constants to) and a held-out set (only
predicted), by source, not by toggles of one configuration:

- published figures: torchtitan's (one source, one cluster) calibrate the
  GPU constants; llm-foundry's, Megatron-LM's and the seed article's are
  held out. One row per independent measurement (a throughput and the MFU
  derived from it are one row).
- CPU runs measured on this host with the real trainer
  (launcher/perf/cpu_runs.yaml, scripts/measure_cpu_runs.py): half
  calibrate the CPU constants, the other half is held out.

The published cases are in :mod:`launcher.plan.published`. Every
prediction uses the same calibration file; a case describes the run
(model, GPUs, fabric, batch, checkpointing, compile), never tunes it. What a
published run did that meshrun's trainer does not (float8 GEMMs, another
selective-checkpointing policy) is stated once for its source.

    python -m launcher.perf_validation           # both sets' errors
    python -m launcher.perf_validation --fit     # refit, write conf/perf/default.yaml

(the command: launcher/commands/perf_validation.py)
"""

from __future__ import annotations

import functools
import statistics
from dataclasses import dataclass
from typing import Any

from launcher.config.compose import compose
from launcher.perf.calibrate import Measured, cpu_params, fit
from launcher.perf.params import PerfParams
from launcher.perf.steptime import Prediction, predict
from launcher.plan.make import make_plan
from launcher.plan.published import CALIBRATION, CASES, GPU_FIT, HELD_OUT, NO_CKPT, Case


@functools.lru_cache(maxsize=128)
def _planned(overrides: tuple[str, ...]):
    cfg = compose(list(overrides) + NO_CKPT)
    return cfg, make_plan(cfg)


def _run(overrides: list[str], p: PerfParams, **kw: Any) -> Prediction:
    cfg, plan = _planned(tuple(overrides))
    return predict(cfg, plan, p, **kw)


def predicted(c: Case, p: PerfParams) -> float:
    pr = _run(c.overrides, p, **c.run)
    if c.unit == "tok/s/GPU":
        return pr.tokens_per_s_per_gpu
    if c.unit == "MFU":
        return pr.mfu
    if c.unit == "ratio":
        return pr.tokens_per_s / _run(c.versus, p).tokens_per_s
    if c.unit == "share":
        b = pr.breakdown
        return (b["fsdp"] + b["hsdp"] + b["tp"] + b["pp_p2p"]) / pr.step_time_s
    raise AssertionError(c.unit)


def as_measured(c: Case) -> Measured | None:
    """A throughput or MFU row as a measured step time (what the fit uses)."""
    if c.unit not in ("tok/s/GPU", "MFU"):
        return None
    cfg, plan = _planned(tuple(c.overrides))
    tps_gpu = c.published
    if c.unit == "MFU":
        tps_gpu = c.published * plan.gpu_peak_bf16_tflops * 1e12 / plan.flops_per_token
    step = plan.tokens_per_step / (tps_gpu * plan.world_size)
    return Measured(c.name.strip(), cfg, plan, step, 1, dict(c.run))


# ---------------------------------------------------------------- evaluation


@dataclass
class Row:
    name: str
    split: str
    unit: str
    published: float  # published figure or measured step time
    predicted: float
    source: str
    extra: str = ""  # load average of a CPU row

    @property
    def error(self) -> float:
        return self.predicted / self.published - 1


def published_rows(p: PerfParams) -> list[Row]:
    return [
        Row(
            c.name,
            c.split,
            c.unit,
            c.published,
            predicted(c, p),
            c.source + (f"; {c.note}" if c.note else ""),
        )
        for c in CASES
    ]


def cpu_host_params(p: PerfParams) -> PerfParams:
    """``p`` with the CPU peak of the host the CPU rows were measured on (so
    that they predict the same anywhere)."""
    from launcher.perf.cpu_runs import host_peak

    h = host_peak()
    return p.replace(
        cpu_peak_gflops_per_core=h["gflops_per_core"], cpu_peak_bf16_gflops_per_core=h["bf16_gflops_per_core"]
    )


def cpu_measured() -> list[tuple[Measured, str, str]]:
    """(measurement, split, the load it was measured under) of every
    measured CPU row."""
    from launcher.perf.cpu_runs import COMMON, load_runs

    out = []
    for r in load_runs():
        if r.step_time_s <= 0:
            continue
        cfg, plan = _planned(tuple(COMMON + r.overrides))
        load = f"load {min(r.load_avg):.1f}-{max(r.load_avg):.1f}" if r.load_avg else ""
        if r.others_cores is not None:
            load += f", other work {r.others_cores:.2f} cores"
        out.append((Measured(r.name, cfg, plan, r.step_time_s, 1), r.split, load))
    return out


def cpu_rows(p: PerfParams) -> list[Row]:
    from launcher.perf.calibrate import predicted_step

    hp = cpu_host_params(p)
    return [
        Row(m.run_dir, split, "step s", m.step_time_s, predicted_step(m, hp), "this host", load)
        for m, split, load in cpu_measured()
    ]


def refit(p: PerfParams) -> PerfParams:
    """Fit the GPU constants on the published calibration rows and the CPU
    constants on the calibration CPU runs (``launcher.perf.calibrate``)."""
    gpu_runs = [m for c in CASES if c.split == CALIBRATION and (m := as_measured(c))]
    p = fit(
        gpu_runs,
        p,
        GPU_FIT,
        label=f"the {len(gpu_runs)} torchtitan calibration rows (launcher/plan/validation.py)",
    )
    cpu_runs = [m for m, split, _ in cpu_measured() if split == CALIBRATION]
    if cpu_runs:
        # The host's probe is used for the fit only: the file keeps its own peaks.
        peaks = {k: getattr(p, k) for k in ("cpu_peak_gflops_per_core", "cpu_peak_bf16_gflops_per_core")}
        label = f"the {len(cpu_runs)} calibration CPU runs of launcher/perf/cpu_runs.yaml"
        p = fit(cpu_runs, cpu_host_params(p), cpu_params(cpu_runs), rounds=8, label=label).replace(**peaks)
    return p


@dataclass
class Choice:
    what: str
    chosen: str
    chosen_s: float
    fastest: str
    fastest_s: float

    @property
    def gap(self) -> float:
        return self.chosen_s / self.fastest_s - 1


def cpu_choices(p: PerfParams) -> list[Choice]:
    """How close the layout the model / planner picks on CPU comes to the
    fastest measured candidate: (1) the planner's own candidates for
    ``parallelism=auto`` (its choice among them, with the model), and (2) the
    model's ranking of every measured layout of the same model and ranks."""
    from launcher.perf.cpu_runs import COMMON, PLANNER_CHECKS

    hp = cpu_host_params(p)
    runs = {m.run_dir: m for m, _, _ in cpu_measured()}
    out = []
    for what, auto_overrides, names in PLANNER_CHECKS:
        cands = [runs[n] for n in names if n in runs]
        if len(cands) < 2:
            continue
        fastest = min(cands, key=lambda m: m.step_time_s)
        if auto_overrides:
            cfg = compose(COMMON + auto_overrides)
            plan = make_plan(cfg, perf_params=hp)
            key = (plan.dp_replicate, plan.dp_shard, plan.tp, plan.pp, plan.activation_checkpointing)
            pick = next(
                m
                for m in cands
                if (
                    m.plan.dp_replicate,
                    m.plan.dp_shard,
                    m.plan.tp,
                    m.plan.pp,
                    m.plan.activation_checkpointing,
                )
                == key
            )
        else:
            pick = min(cands, key=lambda m: predict(m.cfg, m.plan, hp).step_time_s)
        out.append(Choice(what, pick.run_dir, pick.step_time_s, fastest.run_dir, fastest.step_time_s))
    return out


def _fmt(v: float, unit: str) -> str:
    if unit == "tok/s/GPU":
        return f"{v:,.0f}"
    if unit in ("MFU", "share"):
        return f"{v:.1%}"
    if unit == "step s":
        return f"{v:.3f}"
    return f"{v:.2f}x"


def table(rows: list[Row], measured: str = "published") -> str:
    """Markdown table: case, unit, published/measured, predicted, error, source."""
    lines = [
        f"| case | unit | {measured} | predicted | error | source |",
        "| --- | --- | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        src = r.source + (f"; {r.extra}" if r.extra else "")
        lines.append(
            f"| {r.name} | {r.unit} | {_fmt(r.published, r.unit)} | {_fmt(r.predicted, r.unit)} | {r.error:+.0%} | {src} |"
        )
    return "\n".join(lines)


def summary(rows: list[Row]) -> str:
    if not rows:
        return "no rows"
    errs = [abs(r.error) for r in rows]
    within = sum(e <= 0.20 for e in errs)
    return (
        f"{len(rows)} rows, mean |error| {statistics.mean(errs):.0%}, max {max(errs):.0%}, "
        f"{within}/{len(rows)} within 20%"
    )


def report(p: PerfParams) -> str:
    pub, cpu = published_rows(p), cpu_rows(p)
    out = []
    for title, rows, col in (
        (
            "Published figures: calibration set (torchtitan)",
            [r for r in pub if r.split == CALIBRATION],
            "published",
        ),
        (
            "Published figures: held-out set (llm-foundry, Megatron-LM, seed article)",
            [r for r in pub if r.split == HELD_OUT],
            "published",
        ),
        ("CPU runs measured here: calibration set", [r for r in cpu if r.split == CALIBRATION], "measured"),
        ("CPU runs measured here: held-out set", [r for r in cpu if r.split == HELD_OUT], "measured"),
    ):
        out += [f"### {title}", "", summary(rows), "", table(rows, col), ""]
    choices = cpu_choices(p)
    if choices:
        out += ["### Layout choice on CPU (measured step times)", ""]
        out += ["| candidates | picked | its step s | fastest measured | its step s | picked vs fastest |"]
        out += ["| --- | --- | ---: | --- | ---: | ---: |"]
        for c in choices:
            out.append(
                f"| {c.what} | {c.chosen} | {c.chosen_s:.3f} | {c.fastest} | {c.fastest_s:.3f} | {c.gap:+.0%} |"
            )
        out.append("")
    out.append(
        f"Calibration: {p.source}; GPU constants: {p.provenance.get('gpu')}; CPU constants: {p.provenance.get('cpu')}"
    )
    return "\n".join(out)
