"""The run planner: resolves the parallel layout, checks it, and estimates
memory per GPU and cost. Pure Python (no torch): ``launcher.dry_run`` plans a
405B run on a laptop in milliseconds.

Guidance encoded for ``parallelism=auto`` (every choice can be overridden):
- under 7B parameters: FSDP alone;
- 7B-70B: FSDP + tensor parallel 8 inside a node (NVLink);
- above 70B: FSDP + TP + pipeline parallel, and at least 32 GPUs;
- more than one node: shard inside a node, replicate across nodes (HSDP),
  sharding wider only when memory requires it;
- activation checkpointing only as much as memory requires;
- context parallel (GPUs, long sequences) only when no layout without it
  fits (launcher/plan/cpcheck.py).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from launcher.config.plandata import MemoryEstimate, Plan
from launcher.config.schema import ParallelismConfig, RunConfig
from launcher.perf.flops import flops_per_token, param_counts
from launcher.plan.candidates import (
    AC_ORDER,
    INFERENCE_KINDS,
    LARGE_MODEL_PARAMS,
    MIN_GPUS_FOR_PP_MODELS,
    MIN_PREDICTED_GAIN,
    SMALL_MODEL_PARAMS,
    Choice,
    candidate_dp,
    candidate_pp,
    degree_fields,
    global_batch_size,
    ranks_field,
    ranks_per_node,
    split_batches,
)
from launcher.plan.cpcheck import cp_tp_pairs, valid_cp
from launcher.plan.memory import estimate_inference_memory, runtime_reserve, train_memory
from launcher.plan.script import plan_script

if TYPE_CHECKING:
    from launcher.perf.params import PerfParams
from launcher.config.validate import ConfigError, fail


def check_preset(cfg: RunConfig) -> None:
    """An explicit mode keeps its meaning: degrees that would turn it into
    another mode are refused, naming both sides (never a silent switch)."""
    p = cfg.parallelism
    where = f"parallelism.mode={p.mode}" + (f" (parallelism={p.name})" if p.name == p.mode else "")
    needs = {"tp": "fsdp_tp", "pp": "fsdp_tp_pp", "dp_replicate": "hsdp"}
    allowed = {
        "fsdp": {"tp": 1, "pp": 1, "dp_replicate": 1},
        "hsdp": {"tp": 1, "pp": 1},
        "fsdp_tp": {"pp": 1},
    }.get(p.mode, {})
    for name, most in allowed.items():
        value = getattr(p, name)
        if value > most:
            raise ConfigError(
                f"parallelism.{name}={value} conflicts with {where}, which has "
                f"{name}={most}: choose parallelism={needs[name]} for {name}={value}, "
                f"or drop parallelism.{name}"
            )
    if p.mode == "fsdp_tp" and p.tp == 1:
        raise ConfigError(
            f"parallelism.tp=1 conflicts with {where}, which needs tp >= 2 (or 0 to let meshrun choose): "
            "choose parallelism=fsdp for tp=1"
        )
    if p.mode == "fsdp_tp_pp" and p.pp == 1:
        raise ConfigError(
            f"parallelism.pp=1 conflicts with {where}, which needs pp >= 2 (or 0 to let meshrun choose): "
            "choose parallelism=fsdp_tp for pp=1"
        )


def _check_layout(cfg: RunConfig, world: int, rpn: int, device: str, lay: Choice) -> None:
    m, p = cfg.model, cfg.parallelism
    if m.family == "vit" and (lay.tp > 1 or lay.pp > 1):
        raise fail(
            "parallelism", f"tp={lay.tp} pp={lay.pp}", "ViT models train with FSDP/HSDP only: tp=1 pp=1"
        )
    if lay.pp * p.stages_per_rank > m.n_layers:
        raise fail(
            "parallelism.pp",
            lay.pp,
            f"pp x stages_per_rank = {lay.pp * p.stages_per_rank} exceeds model.n_layers={m.n_layers} "
            f"(model={m.name}): each pipeline stage needs at least one layer",
        )
    # TP is the innermost mesh dim (consecutive ranks): its groups stay inside
    # a node exactly when tp divides the ranks per node.
    node_field = ranks_field(cfg)
    heads_ok = m.n_heads % lay.tp == 0 and m.n_kv_heads % lay.tp == 0
    if lay.tp > rpn or rpn % lay.tp or not heads_ok:
        valid = [
            d for d in range(1, rpn + 1) if rpn % d == 0 and m.n_heads % d == 0 and m.n_kv_heads % d == 0
        ]
        rules = []
        if lay.tp > rpn:
            rules.append(f"be <= {rpn} GPUs per node ({node_field}={rpn}): a TP group stays inside one node")
        elif rpn % lay.tp:
            rules.append(
                f"divide {node_field}={rpn}, or a TP group would straddle two nodes (TP needs NVLink)"
            )
        if not heads_ok:
            rules.append(f"divide model.n_heads={m.n_heads} and model.n_kv_heads={m.n_kv_heads}")
        raise fail(
            "parallelism.tp",
            lay.tp,
            f"must {' and '.join(rules)}: choose parallelism.tp from {', '.join(map(str, valid))}",
        )
    if world % (lay.tp * lay.pp):
        raise ConfigError(
            f"{degree_fields(cfg, lay)} = {lay.tp * lay.pp} is invalid: tp x pp must divide the {world} "
            f"ranks (cluster.nodes={cfg.cluster.nodes} x {rpn} ranks per node)"
        )
    product = lay.dp_replicate * lay.dp_shard * lay.tp * lay.pp
    if lay.dp_replicate < 1 or lay.dp_shard < 1 or product != world:
        raise fail(
            "parallelism",
            f"dp_replicate={lay.dp_replicate} dp_shard={lay.dp_shard} tp={lay.tp} pp={lay.pp}",
            f"the degrees must multiply to the {world} ranks of the cluster",
        )
    multi = p.pp_schedule in ("interleaved_1f1b", "zbv")
    if lay.pp > 1 and multi and p.stages_per_rank < 2:
        raise fail(
            "parallelism.stages_per_rank", p.stages_per_rank, f"pp_schedule={p.pp_schedule} needs >= 2"
        )
    if lay.pp > 1 and not multi and p.stages_per_rank != 1:
        raise fail("parallelism.stages_per_rank", p.stages_per_rank, f"pp_schedule={p.pp_schedule} needs 1")
    if p.pp_schedule == "zbv" and p.stages_per_rank != 2:
        raise fail("parallelism.stages_per_rank", p.stages_per_rank, "pp_schedule=zbv needs exactly 2")
    if p.mode == "fsdp_tp" and lay.tp == 1:
        raise fail(
            "parallelism.mode",
            p.mode,
            f"no tensor-parallel degree >= 2 divides both the {rpn} ranks per node ({node_field}) and "
            f"model.n_heads={m.n_heads} / model.n_kv_heads={m.n_kv_heads}: choose parallelism=fsdp",
        )
    if p.mode == "fsdp_tp_pp" and lay.pp == 1:
        raise fail(
            "parallelism.mode",
            p.mode,
            f"no pipeline degree >= 2 fits {world} ranks / tp={lay.tp} and model.n_layers={m.n_layers}: "
            "choose parallelism=fsdp_tp or set parallelism.pp",
        )


def _resolve_mode(mode: str, lay: Choice) -> str:
    if lay.pp > 1:
        return "fsdp_tp_pp"
    if lay.tp > 1:
        return "fsdp_tp"
    if mode == "hsdp" or lay.dp_replicate > 1:
        return "hsdp"
    return "fsdp"


def plan_layout(cfg: RunConfig, perf_params: PerfParams | None = None) -> Plan:
    """The layout of an already checked ``cfg`` (launcher/plan/make.py checks
    it first): degrees, batch, activation checkpointing, memory per rank.
    ``perf_params``: the performance model's calibration for choosing among
    layouts that fit (default: conf/perf/default.yaml). Neither validates nor
    prices: make.py runs those steps around it."""
    if cfg.job.kind == "script":  # a team's own program: its world, nothing to lay out
        return plan_script(cfg)
    c, m, p = cfg.cluster, cfg.model, cfg.parallelism
    rpn, device = ranks_per_node(cfg)
    world = c.nodes * rpn
    if c.metrics_port and c.metrics_port + rpn - 1 > 65535:
        # One exporter per local rank: metrics_port + local rank.
        raise fail(
            "cluster.metrics_port",
            c.metrics_port,
            f"must leave room for one port per rank: <= {65536 - rpn} with {rpn} ranks per node",
        )
    size = param_counts(m).total
    precision = p.precision if p.precision != "auto" else ("bf16" if device == "cuda" else "fp32")
    # CPU ranks share the host's RAM: each gets its share of the node.
    capacity = c.gpu_mem_gb if device == "cuda" else c.mem_per_node_gb / rpn
    reserve, _ = runtime_reserve(c, device, capacity, perf_params)
    if cfg.job.kind in INFERENCE_KINDS and m.family == "llama":
        return _plan_inference(cfg, world, rpn, device, precision, size, (capacity, reserve))
    ac_options = AC_ORDER if p.activation_checkpointing == "auto" else (p.activation_checkpointing,)
    mode = p.mode

    best: tuple[Choice, MemoryEstimate, tuple[int, int, int]] | None = None
    first_error: ConfigError | None = None
    # cp outermost: every layout without context parallel is tried first.
    for cp, tp in cp_tp_pairs(cfg, world, rpn, device, mode, size):
        sub = world // cp  # the ranks the other degrees multiply to
        if cp > 1 and m.seq_len % (2 * cp * tp):  # each rank's two chunks split over tp's sequence parallel
            ok = [str(c) for c in valid_cp(m.seq_len, world) if m.seq_len % (2 * c * tp) == 0] or ["1 (off)"]
            why = f"2 x cp x tp = {2 * cp * tp} (tp={tp}) must divide model.seq_len={m.seq_len}: choose from "
            why += ", ".join(ok)
            first_error = first_error or fail("parallelism.cp", cp, why)
            continue
        for pp in candidate_pp(cfg, sub, tp, mode, size) if cp == 1 else [1]:
            layouts = []
            for dp_r, dp_s in candidate_dp(cfg, sub, max(1, rpn // cp), tp, pp, mode):
                try:
                    _check_layout(cfg, sub, rpn, device, Choice(tp, pp, dp_r, dp_s, ac_options[0]))
                    batches = split_batches(cfg, dp_r * dp_s, tp, pp, device)  # same dp for every pair
                except ConfigError as e:
                    cp_note = (
                        f" (with parallelism.cp={cp}: the other degrees share {sub} ranks)" if cp > 1 else ""
                    )
                    first_error = first_error or (ConfigError(f"{e}{cp_note}") if cp_note else e)
                    continue
                layouts.append((dp_r, dp_s))
            if not layouts:
                continue
            # Preference: least recompute, then the largest micro batch, then
            # the most replication (shard wider only when memory needs it).
            # Keep the first fit per (checkpointing, sharding) pair.
            fitting: dict[tuple[str, int, int], tuple[Choice, MemoryEstimate, tuple[int, int, int]]] = {}
            for ac, batch, (dp_r, dp_s) in itertools.product(ac_options, batches, layouts):
                if (ac, dp_r, dp_s) in fitting:
                    continue
                lay = Choice(tp, pp, dp_r, dp_s, ac, cp)
                mem = train_memory(cfg, lay, batch, precision, capacity, reserve)
                if best is None or mem.total_gb < best[1].total_gb:
                    best = (lay, mem, batch)
                if mem.fits:
                    fitting[(ac, dp_r, dp_s)] = (lay, mem, batch)
            if fitting:
                plans = [_finish(cfg, world, rpn, device, precision, size, *f) for f in fitting.values()]
                return _fastest(cfg, plans, perf_params)
    if best is None:
        assert first_error is not None
        raise first_error
    lay, mem, _ = best
    raise ConfigError(_does_not_fit(cfg, device, rpn, size, lay, mem))


def _inference_layouts(cfg: RunConfig, world: int, rpn: int) -> list[tuple[int, int]]:
    """(tp, pp) candidates of an eval / generate run, fewest GPUs per model
    copy first, tensor parallel (inside a node) before pipeline stages."""
    p, m, kind = cfg.parallelism, cfg.model, cfg.job.kind
    if kind == "generate" and p.pp > 1:
        raise fail(
            "parallelism.pp",
            p.pp,
            "job=generate decodes on replicas of parallelism.tp ranks inside a node: set parallelism.pp=0 or 1 "
            "(pipeline stages are for job=eval and training)",
        )

    def tp_ok(t: int) -> bool:
        return not (
            rpn % t or m.n_heads % t or m.n_kv_heads % t or m.ffn_dim % t or m.vocab_size % t or m.seq_len % t
        )

    if p.tp:
        tps = [p.tp]
    elif p.mode in ("fsdp", "hsdp"):
        tps = [1]
    else:
        tps = [t for t in range(1, min(rpn, 8) + 1) if tp_ok(t) and (t > 1 or p.mode != "fsdp_tp")]
    if p.pp:
        pps = [p.pp]
    elif kind == "generate" or p.mode != "auto" and p.mode != "fsdp_tp_pp":
        pps = [1]
    else:
        pps = [d for d in range(1 if p.mode == "auto" else 2, m.n_layers + 1)]
    layouts = [(t, q) for t in tps for q in pps if world % (t * q) == 0]
    return sorted(layouts, key=lambda tq: (tq[0] * tq[1], tq[1])) or [(tps[0], pps[0])]


def _plan_inference(
    cfg: RunConfig,
    world: int,
    rpn: int,
    device: str,
    precision: str,
    size: float,
    capacity: tuple[float, float],
) -> Plan:
    """eval / generate: the smallest model copy (tp x pp ranks) whose share of
    the weights (and generate's KV cache) fits a GPU; the other ranks are
    data-parallel copies (eval: FSDP over them, generate: replicas taking
    their own prompts). ``capacity``: (GB per rank, its runtime reserve)."""
    m, j = cfg.model, cfg.job
    tried: list[tuple[Choice, MemoryEstimate]] = []
    first_error: ConfigError | None = None
    for tp, pp in _inference_layouts(cfg, world, rpn):
        lay = Choice(tp, pp, 1, world // (tp * pp) if world % (tp * pp) == 0 else 0, "none")
        try:
            _check_layout(cfg, world, rpn, device, lay)
            batches = split_batches(cfg, lay.dp_shard, tp, pp, device)
        except ConfigError as e:
            first_error = first_error or e
            continue
        # eval: the largest micro batch that fits (generate decodes job.batch_size sequences).
        for batch in batches if j.kind == "eval" else batches[:1]:
            mem = estimate_inference_memory(
                m,
                kind=j.kind,
                tp=tp,
                pp=pp,
                micro_batch_size=batch[0],
                kv_sequences=j.batch_size,
                kv_tokens=m.seq_len + j.max_new_tokens,
                precision=precision,
                capacity_gb=capacity[0],
                overhead_gb=capacity[1],
            )
            if mem.fits:
                break
        tried.append((lay, mem))
        if not mem.fits:
            continue
        plan = _finish(cfg, world, rpn, device, precision, size, lay, mem, batch)
        plan.reasons = [_inference_reason(cfg, device, lay, mem, tried[:-1])]
        plan.warnings = [w for w in plan.warnings if "compile" in w]
        return plan
    if not tried:
        assert first_error is not None
        raise first_error
    lay, mem = min(tried, key=lambda t: t[1].total_gb)
    raise ConfigError(_inference_does_not_fit(cfg, device, rpn, lay, mem))


def _mem_terms(mem: MemoryEstimate) -> str:
    return " + ".join(f"{name} {gb:.1f}" for name, gb in mem.terms().items() if gb >= 0.05)


def _per_rank(cfg: RunConfig, device: str, mem: MemoryEstimate) -> str:
    if device == "cuda":
        return f"{mem.capacity_gb:g} GB GPUs (cluster.gpu_mem_gb)"
    return f"{mem.capacity_gb:.1f} GB per CPU rank (cluster.mem_per_node_gb / ranks per node)"


def _inference_reason(
    cfg: RunConfig,
    device: str,
    lay: Choice,
    mem: MemoryEstimate,
    smaller: list[tuple[Choice, MemoryEstimate]],
) -> str:
    kind = cfg.job.kind
    what = "its share of the weights and KV cache" if kind == "generate" else "its share of the weights"
    copies = "replicas taking their own prompts" if kind == "generate" else "data-parallel (FSDP) copies"
    why = "; ".join(f"tp={s.tp} pp={s.pp} would need {sm.total_gb:.1f} GB" for s, sm in smaller[-2:])
    return (
        f"job={kind}: tp={lay.tp} pp={lay.pp} is the smallest layout where {what} fits "
        f"{_per_rank(cfg, device, mem)}: {mem.total_gb:.1f} GB per rank ({_mem_terms(mem)})"
        + (f" ({why})" if why else "")
        + f"; {lay.dp_shard} {copies} of {lay.tp * lay.pp} rank(s)"
    )


def _inference_does_not_fit(cfg: RunConfig, device: str, rpn: int, lay: Choice, mem: MemoryEstimate) -> str:
    c, m, kind = cfg.cluster, cfg.model, cfg.job.kind
    term, term_gb = mem.biggest()
    if term == "KV cache":
        fix = "a smaller job.batch_size (sequences in flight), job.max_new_tokens or model.seq_len"
    elif term == "activations":
        fix = "a smaller train.micro_batch_size / job.batch_size or model.seq_len"
    elif kind == "generate":
        fix = (
            f"GPUs with more memory or more of them per node (tensor parallel stays inside a node of {rpn}; "
            "job=generate runs no pipeline stages), or a smaller model"
        )
    else:
        fix = "more nodes for pipeline stages (cluster.nodes, parallelism.pp), or a smaller model"
    where = "per GPU" if device == "cuda" else "per CPU rank"
    return (
        f"model={m.name} does not fit job={kind} on cluster={c.name}: the smallest share, tp={lay.tp} pp={lay.pp}, "
        f"needs {mem.total_gb:.1f} GB {where} ({_mem_terms(mem)}) but the ranks have "
        f"{_per_rank(cfg, device, mem)}. Biggest term: {term} {term_gb:.1f} GB. Use {fix}."
    )


def _does_not_fit(
    cfg: RunConfig, device: str, rpn: int, size: float, lay: Choice, mem: MemoryEstimate
) -> str:
    """Why the best layout does not fit, its biggest memory term, and what to change."""
    c, m = cfg.cluster, cfg.model
    term, term_gb = mem.biggest()
    parts = " + ".join(f"{name} {gb:.1f}" for name, gb in mem.terms().items() if gb >= 0.05)
    if device == "cuda":
        where = f"per GPU, but cluster={c.name} has {c.gpu_mem_gb:g} GB GPUs (cluster.gpu_mem_gb)"
    else:
        where = (
            f"per CPU rank, but the host RAM cluster.mem_per_node_gb={c.mem_per_node_gb:g} shared by "
            f"{rpn} ranks per node gives {mem.capacity_gb:.1f} GB each"
        )
    if term == "activations":
        ac = (
            ""
            if lay.ac == "full"
            else "activation checkpointing (parallelism.activation_checkpointing=full), "
        )
        fix = (
            f"{ac}a smaller train.micro_batch_size or model.seq_len, or more tensor or context parallel "
            "(parallelism.tp, parallelism.cp)"
        )
    elif device == "cuda":
        big = (
            f" ({size / 1e9:.0f}B models need >= {MIN_GPUS_FOR_PP_MODELS})"
            if size >= LARGE_MODEL_PARAMS
            else ""
        )
        fix = f"more GPUs to shard over (cluster.nodes{big}), parallelism.tp or parallelism.pp, or a smaller model"
    else:
        fix = (
            "a smaller model (model=tiny or model=125m), more nodes (cluster.nodes), or "
            "cluster.mem_per_node_gb set to the node's real RAM if it has more; "
            "more ranks on the same node do not add RAM"
        )
    return (
        f"model={m.name} does not fit: {mem.total_gb:.1f} GB {where}. Biggest term: {term} "
        f"{term_gb:.1f} GB ({parts}) with the best layout tp={lay.tp} pp={lay.pp} cp={lay.cp} "
        f"dp_shard={lay.dp_shard} activation_checkpointing={lay.ac}. Use {fix}."
    )


def _fastest(cfg: RunConfig, plans: list[Plan], perf_params: PerfParams | None = None) -> Plan:
    """The fitting layout the performance model predicts fastest, when it
    predicts a clear win over the first by the guidance's preference (least
    recompute, then most replication); the plan's reasons say which decided."""
    first = plans[0]
    ac_auto = cfg.parallelism.activation_checkpointing == "auto"
    by_preference = f"activation checkpointing {first.activation_checkpointing}: least recompute that fits"
    if not ac_auto:
        for pl in plans:
            pl.reasons.append(f"activation checkpointing {pl.activation_checkpointing}: set by you")
    if len(plans) == 1 or (first.device == "cuda" and first.gpu_peak_bf16_tflops <= 0):
        if ac_auto:
            first.reasons.append(
                by_preference + ("" if len(plans) == 1 else " (no GPU peak to predict with)")
            )
        return first
    from launcher.perf import predict

    speed = [predict(cfg, pl, perf_params).tokens_per_s_per_gpu for pl in plans]
    best = max(range(len(plans)), key=lambda i: speed[i])
    # The guidance's preference order stands unless the model predicts a
    # clear win (held-out errors of ~10% on GPUs, more on CPU: docs/perf-validation.md).
    if speed[best] < MIN_PREDICTED_GAIN * speed[0]:
        if ac_auto:
            first.reasons.append(f"{by_preference}; {_no_faster(len(plans), speed[best], speed[0])}")
        return first
    chosen = plans[best]
    chosen.reasons.append(
        f"layout chosen by the performance model: activation checkpointing {chosen.activation_checkpointing}, "
        f"dp_shard={chosen.dp_shard} x dp_replicate={chosen.dp_replicate}, fastest of {len(plans)} that fit "
        f"({speed[best]:,.0f} vs {speed[0]:,.0f} tokens/s per rank predicted for the least-recompute, "
        "most-replicated one)"
    )
    return chosen


def _no_faster(n: int, best: float, this: float) -> str:
    """The performance model's word on the other fitting layouts."""
    if best <= this:
        return f"no other fitting layout is faster (this one is the fastest of {n}: {this:,.0f} tokens/s per rank)"
    return (
        f"no other fitting layout is {MIN_PREDICTED_GAIN - 1:.0%} faster (the fastest of {n} predicts "
        f"{best:,.0f} tokens/s per rank, this one {this:,.0f})"
    )


def _user_set(p: ParallelismConfig) -> list[str]:
    """The layout choices the command line or a preset fixed (parallelism.*)."""
    set_ = [f"parallelism.mode={p.mode}"] if p.mode != "auto" else []
    return set_ + [
        f"parallelism.{k}={getattr(p, k)}"
        for k in ("dp_replicate", "dp_shard", "tp", "pp", "cp")
        if getattr(p, k)
    ]


def _finish(cfg, world, rpn, device, precision, size, lay, mem, batch) -> Plan:
    c, m, p = cfg.cluster, cfg.model, cfg.parallelism
    mbs, accum, n_mb = batch
    reasons, warnings = [], []
    billions = size / 1e9
    chosen_by_you = _user_set(p)
    if chosen_by_you:
        reasons.append(f"{' '.join(chosen_by_you)}: set by you")
    if p.mode == "auto" and not (p.tp or p.pp):
        if lay.pp > 1:
            reasons.append(f"{billions:.0f}B > 70B: FSDP + TP {lay.tp} + PP {lay.pp}")
        elif lay.tp > 1:
            reasons.append(f"{billions:.1f}B in 7B-70B: FSDP + TP {lay.tp} inside a node (NVLink)")
        else:
            reasons.append(f"{billions:.2f}B < 7B: FSDP alone")
    if lay.cp > 1 and not p.cp:
        reasons.append(f"context parallel {lay.cp}: model.seq_len={m.seq_len} does not fit without it")
    if lay.dp_replicate > 1 and lay.dp_shard == 1:
        reasons.append(f"data parallel: {lay.dp_replicate} full replicas, no sharding (it fits without)")
    elif lay.dp_replicate > 1:
        reasons.append(f"HSDP: shard over {lay.dp_shard}, replicate x{lay.dp_replicate}")
    if size >= LARGE_MODEL_PARAMS and world < MIN_GPUS_FOR_PP_MODELS:
        warnings.append(
            f"{billions:.0f}B models want >= {MIN_GPUS_FOR_PP_MODELS} GPUs; this plan has {world}"
        )
    if device == "cuda" and size < SMALL_MODEL_PARAMS and world < 4:
        warnings.append("FSDP for models under 7B wants at least 4 GPUs")
    if p.compile and device == "cpu":
        warnings.append("torch.compile on CPU is slow to start; meant for GPUs")
    plan = Plan(
        world_size=world,
        nodes=c.nodes,
        ranks_per_node=rpn,
        device=device,
        backend="nccl" if device == "cuda" else "gloo",
        mode=_resolve_mode(p.mode, lay),
        dp_replicate=lay.dp_replicate,
        dp_shard=lay.dp_shard,
        tp=lay.tp,
        pp=lay.pp,
        cp=lay.cp,
        stages_per_rank=p.stages_per_rank if lay.pp > 1 else 1,
        pp_schedule=p.pp_schedule,
        pp_microbatches=n_mb,
        global_batch_size=global_batch_size(cfg, lay.dp_replicate * lay.dp_shard, lay.tp, lay.pp, device),
        micro_batch_size=mbs,
        grad_accum_steps=accum,
        activation_checkpointing=lay.ac,
        precision=precision,
        compile=p.compile,
        params=size,
        flops_per_token=flops_per_token(m),
        gpu_peak_bf16_tflops=c.gpu_peak_bf16_tflops,
        memory=mem,
        cost=None,
        reasons=reasons,
        warnings=warnings,
        _seq_len=m.seq_len,
    )
    return plan


def plan_layout_summary(plan: Plan) -> str:
    dims = " x ".join(f"{k}={v}" for k, v in plan.mesh_dims().items() if v > 1) or "single rank"
    return f"{plan.mode}: {dims} ({plan.world_size} ranks, {plan.device}/{plan.backend})"
