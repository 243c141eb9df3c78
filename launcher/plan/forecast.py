"""A GPU run's risk before it starts: the failure rate it will see, the
checkpoint interval that rate calls for (Young/Daly), and P50 / P90 time and
cost to finish (launcher/perf/reliability.py), for the dry run."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from launcher.config.plandata import Plan
from launcher.config.saveauto import AUTO, SaveAuto, bounds, interval_s, interval_steps, steps_value
from launcher.config.schema import RunConfig
from launcher.config.validate import fail
from launcher.perf.recoverycost import STATE_BYTES_PER_PARAM, restart_today
from launcher.perf.reliability import failure_rate, forecast, young_daly_interval_s

# What one failure costs a run's own forecast (launcher/views/runforecast.py)
# when neither it nor the runs root measured a restart: detection, the
# restart and the restore (Meta FT-HSDP reports ~10 min of stall per failure
# at scale, arXiv 2602.00277). The dry run prices a restart at the plan's
# size with launcher/perf/recoverycost.py instead, as scripts/bench_goodput.py does.
PRIOR_RESTART_S = 600.0


@dataclass
class RunRisk:
    mtbf_h: float
    rate_source: str
    save_cost_s: float  # the loop blocked by one save (predicted)
    interval_steps: int  # the configured save interval
    young_daly_steps: int  # the interval that minimises expected lost time
    p50_h: float
    p90_h: float
    p50_usd: float
    p90_usd: float
    expected_failures: float
    restart_s: float
    restart_basis: str


def _step_and_save_s(cfg: RunConfig, plan: Plan) -> tuple[float, float]:
    """(predicted step seconds, predicted blocking seconds of one save)."""
    from launcher.perf import predict

    step_s = predict(cfg, plan).step_time_s
    # One save's blocking cost: the model's checkpoint stall with a save every step.
    every_step = dataclasses.replace(
        cfg, storage=dataclasses.replace(cfg.storage, save_every_steps=1, save_every_min=0.0)
    )
    return step_s, predict(every_step, plan).breakdown["checkpoint"]


def plan_save_interval(cfg: RunConfig, plan: Plan) -> None:
    """storage.save_every_steps=auto: the first interval (Young/Daly from the
    predicted save cost and this runs root's failure rate at the plan's
    world size; CPU ranks count as GPUs) into ``plan.save_auto``; the
    trainer re-tunes it from measured saves (train/checkpoint/autointerval.py)."""
    if steps_value(cfg.storage.save_every_steps) is not None:
        return
    if cfg.job.kind == "script":
        raise fail(
            "storage.save_every_steps",
            AUTO,
            "job=script saves its own checkpoints (meshrun cannot measure them): give a number of steps",
        )
    step_s, save_cost_s = _step_and_save_s(cfg, plan)
    rate = failure_rate(cfg.launcher.runs_root, cfg.cluster.gpu_h_per_failure)
    mtbf_s = rate.mtbf_h(plan.world_size) * 3600.0
    total = max(1, cfg.train.steps)
    steps = interval_steps(save_cost_s, mtbf_s, step_s, 1, total)
    lo, hi = bounds(steps, total)
    plan.save_auto = SaveAuto(steps, lo, hi, save_cost_s, step_s, mtbf_s, rate.source)


def auto_lines(a: SaveAuto) -> list[tuple[str, str]]:
    """The dry run's row for storage.save_every_steps=auto."""
    mtbf = f"{a.mtbf_s / 3600.0:.3g} h" if math.isfinite(a.mtbf_s) else "none expected"
    yd_s = interval_s(a.save_cost_s, a.mtbf_s)
    return [
        (
            "save interval",
            f"auto: every {a.steps} steps; Young/Daly sqrt(2 x {a.save_cost_s:.2g} s blocked per save "
            f"(predicted) x MTBF {mtbf}) = {yd_s:.3g} s at {a.step_s:.3g} s per step (predicted), "
            f"within 1..train.steps; MTBF from the {a.mtbf_source}; re-tuned from each measured "
            f"save within [{a.min_steps}, {a.max_steps}] steps",
        )
    ]


def run_risk(cfg: RunConfig, plan: Plan) -> RunRisk | None:
    """None where there is no priced GPU run (CPU runs, no cost)."""
    if plan.cost is None or plan.device != "cuda":
        return None
    step_s, save_cost_s = _step_and_save_s(cfg, plan)
    rate = failure_rate(cfg.launcher.runs_root, cfg.cluster.gpu_h_per_failure)
    mtbf_s = rate.mtbf_h(plan.world_size) * 3600.0
    yd_s = young_daly_interval_s(save_cost_s, mtbf_s)
    yd_steps = max(1, min(cfg.train.steps, round(yd_s / step_s))) if step_s > 0 else cfg.train.steps
    every = plan.save_auto.steps if plan.save_auto else steps_value(cfg.storage.save_every_steps)
    assert every is not None  # auto is resolved in make_plan
    restart = restart_today(plan.world_size, plan.params * STATE_BYTES_PER_PARAM, cfg.cluster.gpus_per_node)
    f = forecast(
        plan.cost.hours * 3600.0,
        mtbf_s=mtbf_s,
        restart_s=restart.restart_s,
        interval_s=every * step_s,
        save_cost_s=0.0,  # already in the step time the cost's hours come from
    )
    usd_per_h = (cfg.cluster.nodes + cfg.cluster.spare_nodes) * cfg.cluster.price_on_demand_usd_per_node_hour
    return RunRisk(
        mtbf_h=mtbf_s / 3600.0,
        rate_source=rate.source,
        save_cost_s=save_cost_s,
        interval_steps=every,
        young_daly_steps=yd_steps,
        p50_h=f.p50_h,
        p90_h=f.p90_h,
        p50_usd=f.p50_h * usd_per_h,
        p90_usd=f.p90_h * usd_per_h,
        expected_failures=f.expected_failures,
        restart_s=restart.restart_s,
        restart_basis=restart.basis,
    )


def risk_lines(r: RunRisk) -> list[tuple[str, str]]:
    """(label, text) rows for the dry run."""
    return [
        ("failures", f"MTBF {r.mtbf_h:.3g} h for this job ({r.rate_source})"),
        (
            "checkpoints",
            f"every {r.interval_steps} steps; Young/Daly: every {r.young_daly_steps} "
            f"(sqrt(2 x {r.save_cost_s:.2g} s blocked per save x MTBF))",
        ),
        (
            "forecast",
            f"P50 {r.p50_h:.3g} h / P90 {r.p90_h:.3g} h, on demand P50 ${r.p50_usd:,.0f} / P90 ${r.p90_usd:,.0f}; "
            f"{r.expected_failures:.2g} failures expected, {r.restart_s:.0f} s each to restart "
            f"({r.restart_basis}) plus the work since the last save",
        ),
    ]
