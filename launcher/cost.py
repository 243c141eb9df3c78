"""Cost of a run: GPU-hours x price (on-demand, reserved, on-prem 3-year TCO).

Prices are the cluster preset's dated per-node defaults (the seed article's
Q2 2026 table). Throughput comes from an assumed MFU until a measured figure
or the performance model supplies one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from launcher.flops import recompute_flops_per_token

if TYPE_CHECKING:
    from launcher.plan import Plan
    from launcher.schema import RunConfig

HOURS_PER_YEAR = 8760.0
DEFAULT_MFU = 0.40  # llm-foundry measures ~40% for 13B on 32 H100


@dataclass
class CostEstimate:
    price_date: str
    tokens: float
    mfu: float
    tokens_per_s_per_gpu: float
    hours: float
    gpu_hours: float
    usd_on_demand: float
    usd_reserved: float
    usd_onprem: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_tokens(cfg: RunConfig, plan: Plan) -> float:
    """train.target_tokens, or what train.steps steps of the plan consume."""
    return cfg.train.target_tokens or float(cfg.train.steps * plan.tokens_per_step)


def estimate_cost(cfg: RunConfig, plan: Plan, mfu: float = DEFAULT_MFU) -> CostEstimate | None:
    """None on CPU-only runs: there is no GPU price or peak to use."""
    c = cfg.cluster
    if plan.device != "cuda" or c.gpu_peak_bf16_tflops <= 0:
        return None
    hw_flops = plan.flops_per_token + recompute_flops_per_token(cfg.model, plan.activation_checkpointing)
    # MFU counts model FLOPs only; recompute costs time on top of it.
    tps = mfu * c.gpu_peak_bf16_tflops * 1e12 / hw_flops
    tokens = run_tokens(cfg, plan)
    hours = tokens / (tps * plan.world_size) / 3600.0
    node_hours = hours * c.nodes
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
    )
