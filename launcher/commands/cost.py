"""``meshrun cost`` / ``python -m launcher.cost``: cluster presets side by
side as a table and a PNG chart (cost to train N tokens; scaling efficiency
vs GPUs), priced by the cost model (launcher/perf/pricing.py) on the planner's
layouts.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.config.plandata import CostEstimate
from launcher.config.prog import describe, prog
from launcher.perf.pricing import estimate_cost

if TYPE_CHECKING:
    from launcher.perf import PerfParams

# The seed's table: presets and its "effective throughput" column.
SEED_PRESETS = ["1node_a100", "1node", "4node", "8node", "16node_b200"]
SEED_THROUGHPUT = {"1node_a100": 1.0, "1node": 1.8, "4node": 6.5, "8node": 10.0, "16node_b200": 28.0}


@dataclass
class PresetRow:
    preset: str
    gpus: int
    gpu_type: str
    layout: str
    on_demand_usd_per_hour: float
    reserved_usd_per_year: float
    onprem_usd_3yr: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    mfu: float
    cost: CostEstimate
    relative: float = 0.0  # throughput relative to the first preset
    seed_relative: float | None = None


def compare_presets(
    presets: list[str],
    overrides: list[str],
    tokens: float,
    seqs_per_gpu: int,
    params: PerfParams | None = None,
) -> list[PresetRow]:
    """One row per cluster preset: prices, predicted throughput, cost of ``tokens``."""
    from launcher.config.compose import compose
    from launcher.perf import predict
    from launcher.plan.make import make_plan
    from launcher.plan.planner import plan_layout_summary

    rows = []
    for preset in presets:
        probe = compose([f"cluster={preset}"])
        gpus = probe.cluster.nodes * max(probe.cluster.gpus_per_node, 1)
        cfg = compose(
            [
                f"cluster={preset}",
                f"train.global_batch_size={seqs_per_gpu * gpus}",
                f"train.target_tokens={tokens}",
            ]
            + overrides
        )
        plan = make_plan(cfg)
        pred = predict(cfg, plan, params)
        cost = estimate_cost(cfg, plan, params=params)
        assert cost is not None, preset  # presets here are GPU clusters
        c = cfg.cluster
        rows.append(
            PresetRow(
                preset=preset,
                gpus=plan.world_size,
                gpu_type=c.gpu_type,
                layout=plan_layout_summary(plan).split(" (")[0],
                on_demand_usd_per_hour=c.nodes * c.price_on_demand_usd_per_node_hour,
                reserved_usd_per_year=c.nodes * c.price_reserved_usd_per_node_year,
                onprem_usd_3yr=c.nodes * c.price_onprem_tco_usd_per_node_3yr,
                tokens_per_s=pred.tokens_per_s,
                tokens_per_s_per_gpu=pred.tokens_per_s_per_gpu,
                mfu=pred.mfu,
                cost=cost,
                seed_relative=SEED_THROUGHPUT.get(preset),
            )
        )
    for r in rows:
        r.relative = r.tokens_per_s / rows[0].tokens_per_s
    return rows


def _money(x: float) -> str:
    if x >= 1e6:
        return f"${x / 1e6:.1f}M"
    if x >= 1e4:
        return f"${x / 1e3:.0f}K"
    return f"${x:,.0f}"


def format_table(rows: list[PresetRow], tokens: float) -> str:
    head = (
        "configuration",
        "GPUs",
        "on-demand/hr",
        "reserved/yr",
        "on-prem 3y TCO",
        "seed thrpt",
        "predicted thrpt",
        "tok/s/GPU",
        "MFU",
        f"days for {tokens:.3g} tok",
        "on-demand",
        "reserved",
        "on-prem",
    )
    body = []
    for r in rows:
        k = r.cost
        body.append(
            (
                f"{r.preset} ({r.gpu_type}, {r.layout})",
                str(r.gpus),
                _money(r.on_demand_usd_per_hour),
                _money(r.reserved_usd_per_year),
                _money(r.onprem_usd_3yr),
                f"{r.seed_relative:g}x" if r.seed_relative is not None else "-",
                f"{r.relative:.1f}x",
                f"{r.tokens_per_s_per_gpu:,.0f}",
                f"{r.mfu:.0%}",
                f"{k.hours / 24:,.1f}",
                _money(k.usd_on_demand),
                _money(k.usd_reserved),
                _money(k.usd_onprem),
            )
        )
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    lines = [
        "  ".join(
            h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(x, widths, strict=True))
        )
        for x in [head, *body]
    ]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def plot(
    rows: list[PresetRow], scaling: list[tuple[int, float]], tokens: float, path: str, title: str
) -> None:
    """Cost of ``tokens`` per preset, and scaling efficiency vs GPUs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    names = [r.preset for r in rows]
    x = range(len(rows))
    w = 0.27
    for i, (label, attr) in enumerate(
        (("on-demand", "usd_on_demand"), ("reserved", "usd_reserved"), ("on-prem 3y TCO", "usd_onprem"))
    ):
        ax1.bar([j + (i - 1) * w for j in x], [getattr(r.cost, attr) / 1e3 for r in rows], w, label=label)
    ax1.set_xticks(list(x), names, rotation=15)
    ax1.set_ylabel("k$")
    ax1.set_title(f"cost to train {tokens:.3g} tokens")
    ax1.legend()
    gpus = [g for g, _ in scaling]
    ax2.plot(gpus, [e * 100 for _, e in scaling], marker="o")
    ax2.set_xscale("log", base=2)
    ax2.set_xticks(gpus, [str(g) for g in gpus])
    ax2.set_ylim(0, 105)
    ax2.set_xlabel("GPUs")
    ax2.set_ylabel("scaling efficiency (%)")
    ax2.set_title("tokens/s per GPU relative to one node")
    ax2.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=prog("python -m launcher.cost"), description=describe(__doc__))
    ap.add_argument(
        "overrides", nargs="*", help="overrides applied to every preset, as for run (default model=13b)"
    )
    ap.add_argument("--clusters", default=",".join(SEED_PRESETS), help="comma-separated cluster presets")
    # model=NAME, as every other command takes it; --model stays as a deprecated alias.
    ap.add_argument("--model", default="", help=argparse.SUPPRESS)
    ap.add_argument("--tokens", type=float, default=1e11, help="tokens to train (default 1e11)")
    ap.add_argument("--seqs-per-gpu", type=int, default=2, help="global batch = this x GPUs (weak scaling)")
    ap.add_argument(
        "--scaling-cluster", default="4node", help="preset whose node count the scaling curve varies"
    )
    ap.add_argument("--scaling-nodes", default="1,2,4,8,16")
    ap.add_argument("--png", default="", help="write the chart here")
    ap.add_argument("--perf", default="", help="calibration YAML (default conf/perf/default.yaml)")
    a = ap.parse_args(argv)
    from launcher.config.validate import ConfigError
    from launcher.perf import load_params
    from launcher.plan.scaling import scaling_efficiency

    try:
        params = load_params(a.perf or None)
        typed = [o for o in a.overrides if o.startswith("model=")]
        model = typed[-1].partition("=")[2] if typed else a.model or "13b"
        if typed and a.model and model != a.model:
            raise ValueError(f"--model={a.model} and model={model} differ: give model={model} only")
        a.model = model
        overrides = [f"model={model}", *(o for o in a.overrides if not o.startswith("model="))]
        rows = compare_presets(a.clusters.split(","), overrides, a.tokens, a.seqs_per_gpu, params)
        print(
            f"model={a.model}, {a.seqs_per_gpu} sequences per GPU per step, prices {rows[0].cost.price_date}"
        )
        print(format_table(rows, a.tokens))
        print(
            "seed thrpt: the seed article's 'effective throughput'; predicted thrpt: this model, vs the first row"
        )
        if a.png:
            nodes = [int(n) for n in a.scaling_nodes.split(",")]
            curve = scaling_efficiency(
                [f"cluster={a.scaling_cluster}", *overrides], nodes, a.seqs_per_gpu, params
            )
            plot(rows, [(g, e) for g, e, _ in curve], a.tokens, a.png, f"model={a.model}")
            print(f"chart: {a.png}")
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
