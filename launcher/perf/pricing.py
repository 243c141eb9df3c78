"""Cost of a run: GPU-hours x price (on-demand, reserved, on-prem 3-year TCO),
with throughput from the performance model (:mod:`launcher.perf`).

Prices are the cluster preset's dated per-node defaults (the seed article's
Q2 2026 table). ``python -m launcher.cost`` (launcher/commands/cost.py) compares
presets side by side.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.config.plandata import CostEstimate
from launcher.perf.flops import recompute_flops_per_token

if TYPE_CHECKING:
    from launcher.config.plandata import Plan
    from launcher.config.schema import RunConfig
    from launcher.perf import PerfParams

HOURS_PER_YEAR = 8760.0


def run_tokens(cfg: RunConfig, plan: Plan) -> float:
    """Tokens the run trains: ``train.target_tokens`` when set, else
    ``train.steps`` x the planned tokens per step (the planner's global batch,
    which ``train.global_batch_size=0`` leaves to it)."""
    t = cfg.train
    return t.target_tokens or float(t.steps * plan.tokens_per_step)


def run_steps(cfg: RunConfig, plan: Plan) -> float:
    """Optimizer steps the priced tokens take (``train.steps`` unless
    ``train.target_tokens`` sets the tokens)."""
    return run_tokens(cfg, plan) / plan.tokens_per_step if plan.tokens_per_step else 0.0


def estimate_cost(
    cfg: RunConfig, plan: Plan, mfu: float | None = None, params: PerfParams | None = None
) -> CostEstimate | None:
    """Cost of training ``run_tokens(cfg, plan)`` tokens with ``plan``.

    Throughput from the performance model, or from ``mfu`` when a measured
    figure is given. None on CPU-only runs: there is no GPU price or peak.
    """
    c = cfg.cluster
    if plan.device != "cuda" or c.gpu_peak_bf16_tflops <= 0:
        return None
    if mfu is None:
        from launcher.perf import predict

        pred = predict(cfg, plan, params)
        tps, mfu, basis = pred.tokens_per_s_per_gpu, pred.mfu, "perf model"
    else:
        hw_flops = plan.flops_per_token + recompute_flops_per_token(cfg.model, plan.activation_checkpointing)
        # MFU counts model FLOPs only; recompute costs time on top of it.
        tps, basis = mfu * c.gpu_peak_bf16_tflops * 1e12 / hw_flops, "fixed MFU"
    tokens = run_tokens(cfg, plan)
    hours = tokens / (tps * plan.world_size) / 3600.0
    # Spare nodes are held (and billed) for the whole job beside the training nodes.
    node_hours = hours * (c.nodes + c.spare_nodes)
    return CostEstimate(
        price_date=c.price_date,
        tokens=tokens,
        mfu=mfu,
        tokens_per_s_per_gpu=tps,
        hours=hours,
        gpu_hours=hours * plan.world_size,
        usd_on_demand=node_hours * c.price_on_demand_usd_per_node_hour,
        usd_reserved=node_hours * c.price_reserved_usd_per_node_year / HOURS_PER_YEAR,
        usd_onprem=node_hours * c.price_onprem_tco_usd_per_node_3yr / (3 * HOURS_PER_YEAR),
        basis=basis,
        steps=run_steps(cfg, plan),
        spare_nodes=c.spare_nodes,
    )
