"""``python -m launcher.predict [-m] overrides...``: predicted step time,
tokens/s, MFU and breakdown of a composition; with ``-m``, comma-separated
values sweep (cartesian product) into one comparison table, e.g.
``python -m launcher.predict -m cluster=1node,2node,4node,8node model=13b``.
"""

from __future__ import annotations

import argparse
import itertools
import sys

from launcher.config.prog import describe, prog
from launcher.config.validate import ConfigError
from launcher.perf import load_params, predict
from launcher.perf.breakdown import format_text
from launcher.views.planreport import swept_keys, text_table

COLUMNS = ("compute", "fsdp", "hsdp", "tp", "pp_p2p", "pp_bubble", "data", "checkpoint")


def expand(overrides: list[str], multirun: bool) -> list[list[str]]:
    """Sweep points: with multirun, ``k=a,b`` becomes one point per value."""
    if not multirun:
        return [overrides]
    axes = []
    for o in overrides:
        key, sep, value = o.partition("=")
        if sep and "," in value and not value.startswith("["):
            axes.append([f"{key}={v}" for v in value.split(",")])
        else:
            axes.append([o])
    return [list(p) for p in itertools.product(*axes)]


def _swept(points: list[list[str]]) -> list[str]:
    """Labels: the overrides that differ between points."""
    keys = set(swept_keys(points))
    return [" ".join(o for o in p if o.partition("=")[0] in keys) for p in points]


def _gain(base, pr, other_layout: bool) -> str:  # type: ignore[no-untyped-def]
    """Why a point is predicted faster per GPU than the first: the step term
    that shrank most, in seconds per step."""
    k = max(pr.breakdown, key=lambda t: base.breakdown.get(t, 0.0) - pr.breakdown[t])
    from launcher.perf.breakdown import BREAKDOWN_LABELS

    said = (
        f"{BREAKDOWN_LABELS.get(k, k)} {base.breakdown.get(k, 0.0):.3g} s -> {pr.breakdown[k]:.3g} s per step"
    )
    return ("another layout: " if other_layout else "") + said


def sweep_table(points: list[list[str]], params, tokens: float = 0.0) -> str:
    from launcher.config.compose import compose
    from launcher.plan.make import make_plan
    from launcher.plan.planner import plan_layout_summary

    head = ["point", "GPUs", "layout", "step s", "tok/s/GPU", "MFU", "scaling", *COLUMNS, "+/-"]
    if tokens:
        head.insert(7, f"h for {tokens:.3g}")
    rows = []
    base = None
    base_layout, base_pr = "", None
    over: list[str] = []  # points above 100%: each explained under the table
    for label, ov in zip(_swept(points), points, strict=True):
        try:
            cfg = compose(ov)
            plan = make_plan(cfg)
            pr = predict(cfg, plan, params)
        except (ConfigError, ValueError) as e:
            rows.append([label, "-", f"error: {e}"[:70]] + [""] * (len(head) - 3))
            continue
        base = base or pr.tokens_per_s_per_gpu
        layout = plan_layout_summary(plan).split(" (")[0]
        base_layout, base_pr = base_layout or layout, base_pr or pr
        ratio = pr.tokens_per_s_per_gpu / base
        mark = "*" if ratio > 1.005 else ""
        if mark:
            over.append(f"{label}: {_gain(base_pr, pr, layout != base_layout)}")
        row = [
            label,
            str(plan.world_size),
            layout,
            f"{pr.step_time_s:.3g}",
            f"{pr.tokens_per_s_per_gpu:,.0f}",
            f"{pr.mfu:.1%}",
            f"{ratio:.0%}{mark}",
            *[f"{pr.breakdown[k] / pr.step_time_s:.0%}" if pr.breakdown[k] > 0 else "-" for k in COLUMNS],
            f"{pr.uncertainty_pct:.0f}%",
        ]
        if tokens:
            row.insert(7, f"{pr.hours_for(tokens):,.1f}")
        rows.append(row)
    note = "\n(breakdown columns: share of the step; scaling: tok/s/GPU vs the first point)"
    if over:
        note += (
            f"\n* above 100%: scaling compares the fastest layout that fits at each size (the first "
            f"point's: {base_layout}), not one layout grown; " + "; ".join(over)
        )
    return text_table(head, rows, left=(0, 2)) + note


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=prog("python -m launcher.predict"), description=describe(__doc__))
    ap.add_argument("-m", "--multirun", action="store_true", help="sweep comma-separated values")
    ap.add_argument("--perf", default="", help="calibration YAML (default conf/perf/default.yaml)")
    ap.add_argument("--tokens", type=float, default=0.0, help="also show the time to train this many tokens")
    ap.add_argument("overrides", nargs="*", help="overrides, as for run (e.g. model=13b cluster=4node)")
    a = ap.parse_args(argv)
    try:
        params = load_params(a.perf or None)
        points = expand(a.overrides, a.multirun)
        if len(points) > 1:
            print(sweep_table(points, params, a.tokens))
            return 0
        from launcher.config.compose import compose
        from launcher.plan.make import make_plan
        from launcher.plan.planner import plan_layout_summary

        cfg = compose(points[0])
        plan = make_plan(cfg)
        print(plan_layout_summary(plan))
        print(format_text(predict(cfg, plan, params), a.tokens))
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
