"""A GPU run's risk before it starts: the failure rate it will see, the
checkpoint interval that rate calls for (Young/Daly), and P50 / P90 time and
cost to finish (launcher/perf/reliability.py), for the dry run."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from launcher.config.plandata import Plan
from launcher.config.schema import RunConfig
from launcher.perf.reliability import failure_rate, forecast, young_daly_interval_s

# What one failure costs before training resumes when nothing was measured:
# detection, the restart and the restore (Meta FT-HSDP reports ~10 min of
# stall per failure at scale, arXiv 2602.00277).
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


def run_risk(cfg: RunConfig, plan: Plan) -> RunRisk | None:
    """None where there is no priced GPU run (CPU runs, no cost)."""
    if plan.cost is None or plan.device != "cuda":
        return None
    from launcher.perf import predict

    step_s = predict(cfg, plan).step_time_s
    # One save's blocking cost: the model's checkpoint stall with a save every step.
    every_step = dataclasses.replace(
        cfg, storage=dataclasses.replace(cfg.storage, save_every_steps=1, save_every_min=0.0)
    )
    save_cost_s = predict(every_step, plan).breakdown["checkpoint"]
    rate = failure_rate(cfg.launcher.runs_root)
    mtbf_s = rate.mtbf_h(plan.world_size) * 3600.0
    yd_s = young_daly_interval_s(save_cost_s, mtbf_s)
    yd_steps = max(1, min(cfg.train.steps, round(yd_s / step_s))) if step_s > 0 else cfg.train.steps
    interval_steps = cfg.storage.save_every_steps
    f = forecast(
        plan.cost.hours * 3600.0,
        mtbf_s=mtbf_s,
        restart_s=PRIOR_RESTART_S,
        interval_s=interval_steps * step_s,
        save_cost_s=0.0,  # already in the step time the cost's hours come from
    )
    usd_per_h = cfg.cluster.nodes * cfg.cluster.price_on_demand_usd_per_node_hour
    return RunRisk(
        mtbf_h=mtbf_s / 3600.0,
        rate_source=rate.source,
        save_cost_s=save_cost_s,
        interval_steps=interval_steps,
        young_daly_steps=yd_steps,
        p50_h=f.p50_h,
        p90_h=f.p90_h,
        p50_usd=f.p50_h * usd_per_h,
        p90_usd=f.p90_h * usd_per_h,
        expected_failures=f.expected_failures,
        restart_s=PRIOR_RESTART_S,
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
            f"{r.expected_failures:.2g} failures expected, {r.restart_s:.0f} s each to restart (prior) "
            "plus the work since the last save",
        ),
    ]
