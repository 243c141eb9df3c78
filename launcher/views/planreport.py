"""Human-readable views of a Plan (the dry run and the local run header)."""

from __future__ import annotations

import shlex
from collections.abc import Container, Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from launcher.config.plandata import CostEstimate, Plan
from launcher.config.schema import RunConfig
from launcher.plan.memory import memory_figure, runtime_reserve
from launcher.plan.planner import plan_layout_summary


def usd(x: float) -> str:
    return f"${x:,.0f}" if x >= 100 else f"${x:,.2f}"


def _count(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.0f}"


def text_table(head: Sequence[str], rows: Sequence[Sequence[str]], left: Container[int] = (0,)) -> str:
    """Plain columns (a sweep's points side by side): a header, a rule, a row
    each; columns in ``left`` are left-aligned, the rest (numbers) right."""
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = [
        "  ".join(
            c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for r in [head, *rows]
    ]
    lines.insert(1, "-" * max(map(len, lines)))
    return "\n".join(lines)


def swept_keys(points: Sequence[Sequence[str]]) -> list[str]:
    """The override keys whose values differ between sweep points (in the
    order typed); none differs: every key."""
    parsed = [dict(o.partition("=")[::2] for o in p) for p in points]
    keys = list(dict.fromkeys(k for d in parsed for k in d))
    varying = [k for k in keys if len({d.get(k) for d in parsed}) > 1]  # missing (None) differs too
    return varying or keys


def plan_tables(cfg: RunConfig, plan: Plan) -> list[Table]:
    """Layout, memory per GPU and cost of a plan, as rich tables."""
    if cfg.job.kind == "script":  # a team's program: no model, memory or price of meshrun's
        return [_script_table(cfg, plan)]
    tables = [_layout_table(cfg, plan), _memory_table(cfg, plan)]
    if plan.device == "cuda" and plan.gpu_peak_bf16_tflops > 0:
        tables.append(_prediction_table(cfg, plan))
    if plan.cost is not None:
        tables.append(_cost_table(plan.cost))
        tables.extend(_risk_table(cfg, plan))
    return tables


def _script_table(cfg: RunConfig, plan: Plan) -> Table:
    j, c, q = cfg.job, cfg.cluster, cfg.qos
    t = Table(title=f"meshrun plan: job=script cluster={c.name}", show_header=False)
    t.add_column(style="bold")
    t.add_column()
    program = [j.python, *(["-m", j.module] if j.module else [j.script]), *j.args]
    t.add_row("program", shlex.join(program))
    t.add_row("workdir", j.workdir)
    t.add_row("layout", f"{plan_layout_summary(plan)}; launch={j.launch}")
    when = (
        f"at preemption and {plan.signal_lead_s} s before the time limit"
        if c.kind == "slurm"
        else "on Ctrl-C"
    )
    t.add_row("stop", f"{j.stop_signal} to the program {when}")
    t.add_row("progress", escape(j.progress_regex) if j.progress_regex else "the progress file only")
    t.add_row("qos", f"partition={q.partition} qos={q.qos} account={q.account} time={q.time_limit_min} min")
    for w in plan.warnings:
        t.add_row("[yellow]warning[/]", w)
    return t


def _risk_table(cfg: RunConfig, plan: Plan) -> list[Table]:
    from launcher.plan.forecast import risk_lines, run_risk

    risk = run_risk(cfg, plan)
    if risk is None:
        return []
    t = Table(title="risk (launcher/plan/forecast.py)", show_header=False)
    t.add_column(style="bold")
    t.add_column()
    for label, text in risk_lines(risk):
        t.add_row(label, text)
    return [t]


def _layout_table(cfg: RunConfig, plan: Plan) -> Table:
    c, m = cfg.cluster, cfg.model
    layout = Table(title=f"meshrun plan: model={m.name} cluster={c.name}", show_header=False)
    layout.add_column(style="bold")
    layout.add_column()
    layout.add_row("layout", plan_layout_summary(plan))
    layout.add_row(
        "degrees",
        f"dp_replicate={plan.dp_replicate} dp_shard={plan.dp_shard} tp={plan.tp} pp={plan.pp} cp={plan.cp}"
        + (
            f" (stages/rank {plan.stages_per_rank}, {plan.pp_schedule}, {plan.pp_microbatches} microbatches)"
            if plan.pp > 1
            else ""
        ),
    )
    layout.add_row(
        "batch",
        f"global {plan.global_batch_size} x seq {m.seq_len} = {plan.tokens_per_step:,} tokens/step; "
        f"micro {plan.micro_batch_size}, grad accum {plan.grad_accum_steps}",
    )
    layout.add_row(
        "numerics",
        f"{plan.precision}, activation checkpointing {plan.activation_checkpointing}, compile {plan.compile}"
        + ("" if cfg.train.float8 == "off" else f", float8 {cfg.train.float8} (torchao)"),
    )
    layout.add_row("model", f"{_count(plan.params)} params, {_count(plan.flops_per_token)}FLOP/token")
    layout.add_row(
        "qos",
        f"partition={cfg.qos.partition} qos={cfg.qos.qos} account={cfg.qos.account} time={cfg.qos.time_limit_min} min",
    )
    auto = plan.save_auto
    every = f"every {auto.steps} steps, auto" if auto else f"every {cfg.storage.save_every_steps} steps"
    layout.add_row("storage", f"{cfg.storage.name} ({every})")
    if auto:
        from launcher.plan.forecast import auto_lines

        for label, text in auto_lines(auto):
            layout.add_row(label, text)
    for r in plan.reasons:
        layout.add_row("why", r)
    for w in plan.warnings:
        layout.add_row("[yellow]warning[/]", w)
    return layout


def _memory_table(cfg: RunConfig, plan: Plan) -> Table:
    mem = plan.memory
    gpu = plan.device == "cuda"
    _, reserve_why = runtime_reserve(cfg.cluster, plan.device, mem.capacity_gb)
    used, usable = memory_figure(cfg.cluster, plan.device, mem)
    # One figure wherever it appears (title, table, sweep table): used of usable.
    figure = f"{used:,.1f} of {usable:,.1f} GB usable" if usable else f"{used:,.1f} GB"
    title = ("memory per GPU" if gpu else "memory per rank (host RAM)") + f": {figure}"
    memt = Table(title=title)
    memt.add_column("")
    memt.add_column("GB", justify="right")
    rows = [
        ("parameters (fp32 shard)", mem.params_gb),
        ("gradients (fp32 shard)", mem.grads_gb),
        ("optimizer (AdamW moments)", mem.optimizer_gb),
        ("gathered blocks in flight", mem.unsharded_gb),
        (f"activations (checkpointing {plan.activation_checkpointing})", mem.activations_gb),
    ]
    if plan.activation_checkpointing != "none":
        rows.append(("  (without checkpointing)", mem.activations_no_ac_gb))
    if mem.kv_cache_gb:
        rows.append(("KV cache", mem.kv_cache_gb))
    for name, gb in rows:
        memt.add_row(name, f"{gb:,.2f}")
    memt.add_row("[bold]used[/]", f"[bold]{figure}[/]")
    if reserve_why:
        memt.caption = (
            f"usable: {mem.capacity_gb:g} GB less a reserve of {mem.overhead_gb:.2f} GB: {reserve_why}"
        )
    return memt


def _prediction_table(cfg: RunConfig, plan: Plan) -> Table:
    from launcher.perf import predict
    from launcher.perf.breakdown import format_prediction

    pred = Table(
        title="predicted step (launcher.perf; python -m launcher.predict for sweeps)", show_header=False
    )
    pred.add_column(style="bold")
    pred.add_column()
    # The run's hours are on the cost line.
    for label, value in format_prediction(predict(cfg, plan)):
        pred.add_row(label, value)
    return pred


def cost_line(k: CostEstimate) -> str:
    """The run's size and price on one line: steps, tokens, hours, dollars."""
    return (
        f"{k.steps:,.0f} steps, {_count(k.tokens)} tokens, {k.hours:,.3g} h on the plan's GPUs: "
        f"{usd(k.usd_on_demand)} on-demand, {usd(k.usd_reserved)} reserved, "
        f"{usd(k.usd_onprem)} on-prem (prices {k.price_date}"
        + (f"; {k.spare_nodes} spare node(s) included" if k.spare_nodes else "")
        + ")"
    )


def _cost_table(k: CostEstimate) -> Table:
    cost = Table(title="cost", show_header=False)
    cost.add_column(style="bold")
    cost.add_column()
    cost.add_row("run", cost_line(k))
    cost.add_row(
        "from",
        f"{k.tokens_per_s_per_gpu:,.0f} tokens/s per GPU ({k.basis}), MFU {k.mfu:.0%}, "
        f"{k.gpu_hours:,.3g} GPU-hours",
    )
    return cost


def print_plan(cfg: RunConfig, plan: Plan, console: Console | None = None) -> None:
    console = console or Console()
    for t in plan_tables(cfg, plan):
        console.print(t)
