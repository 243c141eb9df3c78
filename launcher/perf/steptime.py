"""One training step of a layout (``Layout``, launcher/config/plandata.py):
compute, collectives per parallel dimension, overlap, pipeline bubble,
data-loader and checkpoint stalls.

Per rank and per step, for the slowest pipeline stage (the last: it also
holds the output head):

- compute: each GEMM of a block (qkv, o, w1/w3, w2 and the head) at the GPU's
  matmul efficiency, or HBM-bound when its arithmetic intensity is low;
  attention at the flash-attention efficiency on the causal (halved) FLOPs;
  elementwise ops and the loss as HBM traffic (less under torch.compile);
  recompute from activation checkpointing; the AdamW step.
- FSDP: all-gather of the stage's parameters in forward and again in
  backward, reduce-scatter of fp32 gradients, per microbatch (FSDP2's
  default); with a pipeline, one all-gather per step (no reshard after
  forward). HSDP adds an all-reduce of the gradient shard across replicas.
  These overlap with compute (prefetch); the first all-gather and the last
  reduce-scatter of a step are exposed, the rest only beyond the compute.
- TP with sequence parallel: per block and microbatch, 2 all-gathers and 2
  reduce-scatters of the activations in forward, as many in backward (and in
  the recompute); on the critical path.
- PP: one send per microbatch and stage boundary each way (partly hidden),
  and the schedule's bubble: (pp-1)/(microbatches x stages per rank) of the
  compute, less for zero-bubble schedules.
- CP (context parallel): a rank computes seq_len / cp of each sequence's
  tokens (its queries against all keys), plus ring attention's K/V passes
  (launcher/perf/ring.py); FSDP shards over dp_shard x cp.
- CPU ranks (gloo): a collective is work of the same cores that compute
  (copies, loopback sockets), so none of it hides behind compute, and a
  rank's share of the copy bandwidth is its share of the node's cores, as
  for its peak.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from launcher.perf import comm, ring
from launcher.perf.flops import param_counts, recompute_flops_per_token, tokens_per_sample
from launcher.perf.fp8gemm import float8_matmul_factor, float8_note, float8_recipe
from launcher.perf.params import PerfParams, load_params
from launcher.perf.stalls import checkpoint_stall, data_stall

if TYPE_CHECKING:
    from launcher.config.plandata import Layout
    from launcher.config.schema import RunConfig

GB = 1e9
REDUCE_BYTES = 4  # fp32 gradient reduction in both precisions


@dataclass
class Collective:
    dim: str  # fsdp | hsdp | tp | pp | cp
    op: str  # all_gather | reduce_scatter | all_reduce | p2p
    group: int
    nbytes: float  # per call (full tensor size)
    link: str
    calls_per_step: float
    seconds_per_step: float


@dataclass
class Prediction:
    """What one step of a plan costs, and where the time goes."""

    step_time_s: float
    tokens_per_step: int
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    mfu: float  # model FLOPs (no recompute) / peak
    hfu: float  # hardware FLOPs (with recompute) / peak
    peak_tflops: float
    world_size: int
    # Seconds per step on the critical path; they sum to step_time_s.
    breakdown: dict[str, float]
    # Total (hidden + exposed) communication seconds per step by dimension.
    comm_total_s: dict[str, float]
    # The compute entry split: matmul, attention, elementwise, optimizer, ...
    compute_detail: dict[str, float] = field(default_factory=dict)
    collectives: list[Collective] = field(default_factory=list)
    uncertainty_pct: float = 15.0
    notes: list[str] = field(default_factory=list)
    params_source: str = ""
    # Where this prediction's device constants came from: the peak (preset
    # or the host's matmul probe) and the fitted efficiencies.
    device_source: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def hours_for(self, tokens: float) -> float:
        return tokens / self.tokens_per_s / 3600.0


def _gemm_time(m: float, k: float, n: float, peak: float, eff: float, hbm: float, act_bytes: int) -> float:
    """Forward + backward (3 GEMMs of the same shape) of an (m x k) @ (k x n)."""
    flops = 2 * m * k * n
    nbytes = act_bytes * (m * k + k * n + m * n)
    return 3 * max(flops / (peak * eff), nbytes / hbm)


def _group_link(c, device: str, rpn: int, p: PerfParams, group: int, stride: int) -> comm.Link:
    """The link a mesh group of ``group`` ranks, ``stride`` ranks apart, crosses."""
    if group <= 1 or group * stride <= rpn:
        link = comm.intra_node_link(c, device, p)
    else:
        per_node = min(group, max(1, rpn // stride))
        link = comm.inter_node_link(c, device, rpn, p, per_node)
    if device == "cpu":
        # Gloo's copies run on the cores the ranks compute on: a rank's share
        # of the copy bandwidth is its share of the cores, as for its peak.
        from launcher.perf.cpu_peak import node_cores

        share = min(1.0, node_cores(c.kind, c.cpus_per_node) / max(rpn, 1))
        link = comm.Link(link.name, link.gb_per_s * share, link.latency_s)
    return link


def cpu_rank_peak(cfg: RunConfig, plan: Layout, p: PerfParams | None = None) -> tuple[float, str]:
    """(GFLOP/s per CPU rank at the plan's precision, where it came from).
    The trainer's logged MFU on CPU divides by the same figure."""
    from launcher.perf.cpu_peak import node_cores, rank_peak_gflops

    p = p or load_params()
    c = cfg.cluster
    bf16 = plan.precision == "bf16"
    cores = node_cores(c.kind, c.cpus_per_node)
    key = "cpu_peak_bf16_gflops_per_core" if bf16 else "cpu_peak_gflops_per_core"
    rank, per_core, how = rank_peak_gflops(
        plan.precision, cores, plan.ranks_per_node, getattr(p, key), f"{key} in {p.source}"
    )
    eff = "cpu_bf16_matmul_efficiency" if bf16 else "cpu_matmul_efficiency"
    return rank, (
        f"CPU {'bf16' if bf16 else 'fp32'} peak {per_core:.1f} GFLOP/s per core x {cores} cores / "
        f"{plan.ranks_per_node} ranks, {how}; efficiency {eff}: {p.provenance.get('cpu', 'not fitted')}"
    )


def predict(
    cfg: RunConfig,
    plan: Layout,
    params: PerfParams | None = None,
    *,
    float8: bool | str | None = None,
    selective_matmul_recompute: float | None = None,
) -> Prediction:
    """Predict one step of ``plan`` (see the module docstring): each cost
    term is its own function below; this sums them on the critical path.

    ``float8``: the recipe of the block GEMMs (torchao); None: the run's
    ``train.float8``; True: tensorwise (published runs that used float8).
    ``selective_matmul_recompute``: share of the forward matmuls selective AC
    recomputes, for runs whose policy differs from meshrun's (which keeps
    every matmul output): torchtitan's op-level SAC recomputes every other
    one (0.5).
    """
    p = params or load_params()
    d = _device(cfg, plan, p)
    sh = _shape(cfg.model, plan)
    collectives: list[Collective] = []
    recipe = float8_recipe(cfg, float8)
    t_mb_compute, detail = _compute(cfg.model, plan, p, d, sh, recipe, selective_matmul_recompute)
    t_mb_tp = _tp_comm(cfg, plan, p, sh, collectives)
    cp_link = _group_link(cfg.cluster, plan.device, sh.rpn, p, plan.cp, sh.tp)
    rc = ring.ring_attention(cfg.model, plan.cp, sh, cp_link, detail["attention"])
    if rc.passes:
        collectives.append(Collective("cp", "p2p", plan.cp, rc.kv_bytes, rc.link, rc.passes, rc.total_s))
    compute_s = sh.n_mb * t_mb_compute
    tp_s = sh.n_mb * t_mb_tp
    bubble_s, pp_s, pp_total = _pp_comm(cfg, plan, p, sh, t_mb_compute + t_mb_tp, collectives)
    stage_params = _stage_params(cfg.model, plan, sh)
    fsdp_total, hsdp_total, fsdp_edge = _dp_comm(cfg, plan, p, sh, stage_params, collectives)
    exposed_dp, fsdp_exposed, hsdp_exposed, interference = _overlap(
        p, sh, fsdp_total, hsdp_total, fsdp_edge, compute_s + tp_s
    )
    # ---- optimizer, fixed overhead ----
    sharded = stage_params / (plan.dp_shard * plan.cp)
    optim_s = sharded * p.optimizer_bytes_per_param / d.hbm
    compute_s += optim_s + interference
    detail["optimizer"] = optim_s
    detail["comm_interference"] = interference
    # ---- stalls: data loading and checkpoints ----
    busy = compute_s + tp_s + rc.exposed_s + pp_s + bubble_s + exposed_dp + d.step_overhead_s
    data_s = data_stall(cfg, plan, p, busy, sh.cpu)
    ckpt_s = checkpoint_stall(cfg, plan, p, sharded, busy + data_s)
    breakdown = {
        "compute": compute_s,
        "fsdp": fsdp_exposed,
        "hsdp": hsdp_exposed,
        "tp": tp_s,
        "cp": rc.exposed_s,
        "pp_p2p": pp_s,
        "pp_bubble": bubble_s,
        "data": data_s,
        "checkpoint": ckpt_s,
        "overhead": d.step_overhead_s,
    }
    pred = _prediction(cfg, plan, p, d, sh, breakdown)
    pred.comm_total_s = {
        "fsdp": fsdp_total,
        "hsdp": hsdp_total,
        "tp": tp_s,
        "cp": rc.total_s,
        "pp_p2p": pp_total,
    }
    pred.compute_detail = detail
    pred.collectives = collectives
    if recipe != "off":
        pred.notes.append(float8_note(p, recipe, sh.cpu))
    return pred


@dataclass(frozen=True)
class _Device:
    """One rank's device constants at the plan's precision."""

    peak: float  # FLOP/s
    eff_mm: float  # matmul efficiency
    eff_attn: float  # attention efficiency
    hbm: float  # memory bytes/s
    block_overhead_s: float
    step_overhead_s: float
    source: str  # where the peak and the efficiencies came from


def _device(cfg: RunConfig, plan: Layout, p: PerfParams) -> _Device:
    if plan.device == "cpu":
        rank_gflops, source = cpu_rank_peak(cfg, plan, p)
        # bf16 and fp32 kernels reach different shares of their own peaks.
        eff = p.cpu_bf16_matmul_efficiency if plan.precision == "bf16" else p.cpu_matmul_efficiency
        return _Device(
            peak=rank_gflops * 1e9,
            eff_mm=min(1.0, eff),
            eff_attn=min(1.0, eff),
            hbm=p.cpu_mem_gb_per_s_per_rank * GB,
            block_overhead_s=p.cpu_block_overhead_s,
            step_overhead_s=p.cpu_step_overhead_s,
            source=source,
        )
    if plan.gpu_peak_bf16_tflops <= 0:
        raise ValueError(f"cluster.gpu_peak_bf16_tflops={plan.gpu_peak_bf16_tflops} must be > 0 to predict")
    g = p.gpu(cfg.cluster.gpu_type)
    peak = plan.gpu_peak_bf16_tflops * 1e12
    if plan.precision == "fp32":
        peak /= 2  # TF32 tensor cores: half the bf16 rate
    return _Device(
        peak=peak,
        eff_mm=min(1.0, g.matmul_efficiency),
        eff_attn=min(1.0, g.attention_efficiency),
        hbm=g.hbm_gb_per_s * GB * p.hbm_efficiency,
        block_overhead_s=p.block_overhead_s,
        step_overhead_s=p.step_overhead_s,
        source=(
            f"GPU peak {plan.gpu_peak_bf16_tflops:g} TFLOP/s (cluster.gpu_peak_bf16_tflops); "
            f"efficiencies: {p.provenance.get('gpu', 'not fitted')}"
        ),
    )


@dataclass(frozen=True)
class _Shape:
    """The slowest rank's share of the model and the batch."""

    cpu: bool
    act_bytes: int
    tp: int
    pp: int
    v: int  # stages per rank
    rpn: int  # ranks per node
    s: int  # tokens per sample
    tokens_mb: int  # tokens per microbatch
    n_mb: int  # microbatches per step
    layers: int  # blocks on the slowest rank
    hd: int  # head dimension
    kv_dim: int
    head_out: int
    head_tokens: int  # rows of the output head per microbatch
    vit: bool
    ac: str  # activation checkpointing


def _shape(m: Any, plan: Layout) -> _Shape:
    tp, pp, v = plan.tp, plan.pp, plan.stages_per_rank
    s = tokens_per_sample(m)
    tokens_mb = plan.micro_batch_size * s // plan.cp  # this rank's share of each sequence
    hd = m.dim // m.n_heads
    vit = m.family == "vit"
    return _Shape(
        cpu=plan.device == "cpu",
        act_bytes=2 if plan.precision == "bf16" else 4,
        tp=tp,
        pp=pp,
        v=v,
        rpn=plan.ranks_per_node,
        s=s,
        tokens_mb=tokens_mb,
        n_mb=plan.pp_microbatches if pp > 1 else plan.grad_accum_steps,
        layers=math.ceil(m.n_layers / (pp * v)) * v,
        hd=hd,
        kv_dim=m.n_kv_heads * hd if m.family != "vit" else m.dim,
        head_out=m.num_classes if m.family == "vit" else m.vocab_size,
        head_tokens=plan.micro_batch_size if vit else tokens_mb,
        vit=vit,
        ac=plan.activation_checkpointing,
    )


def _block_matmul_s(m: Any, p: PerfParams, d: _Device, sh: _Shape, float8: str) -> float:
    """Forward + backward of a block's GEMMs, per microbatch."""
    tp, hd = sh.tp, sh.hd
    if sh.vit:
        shapes = [
            (m.dim, 3 * m.dim // tp),
            (m.dim // tp, m.dim),
            (m.dim, m.ffn_dim // tp),
            (m.ffn_dim // tp, m.dim),
        ]
    else:
        shapes = [
            (m.dim, (m.n_heads * hd + 2 * sh.kv_dim) // tp),
            (m.n_heads * hd // tp, m.dim),
            (m.dim, 2 * m.ffn_dim // tp),
            (m.ffn_dim // tp, m.dim),
        ]
    return float8_matmul_factor(p, float8, sh.cpu) * sum(
        _gemm_time(sh.tokens_mb, k, n, d.peak, d.eff_mm, d.hbm, sh.act_bytes) for k, n in shapes
    )


def _recompute_shares(
    m: Any, plan: Layout, sh: _Shape, selective_matmul_recompute: float | None
) -> tuple[float, float, float]:
    """(matmul, elementwise, attention) shares activation checkpointing reruns:
    full AC reruns each block's forward (a third of fwd+bwd); selective
    reruns the elementwise ops and a sliver of the matmul work."""
    ac = sh.ac
    mm_re = recompute_flops_per_token(m, ac) / max(plan.flops_per_token, 1.0)
    if ac == "selective" and selective_matmul_recompute is not None:
        mm_re = selective_matmul_recompute / 3  # the forward is a third of fwd+bwd
    ew_re = 1 / 3 if ac in ("full", "selective") else 0.0
    attn_re = 1 / 3 if ac == "full" else 0.0
    return mm_re, ew_re, attn_re


def _compute(
    m: Any,
    plan: Layout,
    p: PerfParams,
    d: _Device,
    sh: _Shape,
    float8: str,
    selective_matmul_recompute: float | None,
) -> tuple[float, dict[str, float]]:
    """(compute seconds per microbatch, the step's compute split)."""
    tp, tokens_mb, head_tokens = sh.tp, sh.tokens_mb, sh.head_tokens
    t_block_mm = _block_matmul_s(m, p, d, sh, float8)
    t_head = _gemm_time(head_tokens, m.dim, sh.head_out / tp, d.peak, d.eff_mm, d.hbm, sh.act_bytes)
    # Attention score/value products: counted as 12 L H hd s per token (no
    # causal halving, torchtitan's MFU convention); flash kernels do half.
    attn_flops = 12 * m.n_heads * sh.hd * sh.s * tokens_mb / tp
    causal = 0.5 if not sh.vit else 1.0
    t_block_attn = attn_flops * causal / (d.peak * d.eff_attn)
    ew_factor = p.compile_elementwise_factor if plan.compile else 1.0
    ew_bytes = (
        p.elementwise_bytes_per_dim * m.dim
        + p.elementwise_bytes_per_kv * sh.kv_dim
        + p.elementwise_bytes_per_ffn * m.ffn_dim
    ) * (sh.act_bytes / 2)
    t_block_ew = ew_bytes * ew_factor * tokens_mb / tp / d.hbm
    t_loss = p.loss_bytes_per_vocab * ew_factor * head_tokens * sh.head_out / tp / d.hbm
    mm_re, ew_re, attn_re = _recompute_shares(m, plan, sh, selective_matmul_recompute)
    t_block = t_block_mm * (1 + mm_re) + t_block_attn * (1 + attn_re) + t_block_ew * (1 + ew_re)
    t_block_fixed = d.block_overhead_s * (0.5 if plan.compile else 1.0)
    layers, n_mb = sh.layers, sh.n_mb
    t_mb_compute = layers * (t_block + t_block_fixed) + t_head + t_loss
    detail = {
        "matmul": n_mb * (layers * t_block_mm * (1 + mm_re) + t_head),
        "attention": n_mb * layers * t_block_attn * (1 + attn_re),
        "elementwise": n_mb * (layers * t_block_ew * (1 + ew_re) + t_loss),
        "fixed_per_block": n_mb * layers * t_block_fixed,
    }
    return t_mb_compute, detail


def _tp_comm(cfg: RunConfig, plan: Layout, p: PerfParams, sh: _Shape, out: list[Collective]) -> float:
    """TP: sequence-parallel all-gathers / reduce-scatters per block; seconds
    per microbatch, on the critical path."""
    tp = sh.tp
    if tp <= 1:
        return 0.0
    tp_link = _group_link(cfg.cluster, plan.device, sh.rpn, p, tp, 1)
    size = sh.tokens_mb * cfg.model.dim * sh.act_bytes
    calls = 8 + (4 if sh.ac == "full" else 0)  # fwd 2+2, bwd 2+2, recompute 2+2
    t_call = comm.ring_all_gather(tp, size, tp_link)
    t_mb_tp = sh.layers * calls * t_call
    n_calls = sh.layers * calls * sh.n_mb
    out.append(
        Collective("tp", "all_gather+reduce_scatter", tp, size, tp_link.name, n_calls, t_mb_tp * sh.n_mb)
    )
    return t_mb_tp


def _pp_comm(
    cfg: RunConfig, plan: Layout, p: PerfParams, sh: _Shape, t_mb: float, out: list[Collective]
) -> tuple[float, float, float]:
    """PP: (the schedule's bubble, exposed sends, all sends) seconds per step."""
    pp, v, n_mb = sh.pp, sh.v, sh.n_mb
    if pp <= 1:
        return 0.0, 0.0, 0.0
    if plan.pp_schedule in ("interleaved_1f1b", "zbv"):
        bubble_s = (pp - 1) * t_mb / v
        if plan.pp_schedule == "zbv":
            bubble_s *= 1 - p.zero_bubble_fill
    else:
        bubble_s = (pp - 1) * t_mb
    pp_link = _group_link(cfg.cluster, plan.device, sh.rpn, p, pp, plan.world_size // pp)
    size = sh.tokens_mb * cfg.model.dim * sh.act_bytes / sh.tp
    sends = (n_mb * v + pp - 1) * 2
    pp_total = sends * comm.p2p(size, pp_link)
    pp_s = pp_total * (0.0 if sh.cpu else 1 - p.pp_p2p_overlap)  # as for FSDP on CPU
    out.append(Collective("pp", "p2p", 2, size, pp_link.name, sends, pp_total))
    return bubble_s, pp_s, pp_total


def _stage_params(m: Any, plan: Layout, sh: _Shape) -> float:
    """Parameters of the slowest rank's stage, per TP rank."""
    pc = param_counts(m)
    edge = pc.embedding + pc.output if sh.pp == 1 else max(pc.embedding, pc.output)
    return (sh.layers * pc.per_layer + edge) / sh.tp


def _dp_comm(
    cfg: RunConfig, plan: Layout, p: PerfParams, sh: _Shape, stage_params: float, out: list[Collective]
) -> tuple[float, float, float]:
    """FSDP / HSDP: (FSDP seconds, HSDP seconds, the part that waits alone:
    the first block's all-gather and the last reduce-scatter) per step."""
    c, layers, n_mb, pp, tp = cfg.cluster, sh.layers, sh.n_mb, sh.pp, sh.tp
    fsdp_total = hsdp_total = fsdp_edge = 0.0
    shard = plan.dp_shard * plan.cp  # cp ranks hold the same parameters: FSDP shards over both
    if shard > 1:
        link = _group_link(c, plan.device, sh.rpn, p, shard, tp)
        ag_size = stage_params * sh.act_bytes
        rs_size = stage_params * REDUCE_BYTES
        n_ag = 1 if pp > 1 else 2 * n_mb
        n_rs = 1 if pp > 1 else n_mb
        t_ag = comm.ring_all_gather(shard, ag_size, link)
        t_rs = comm.ring_reduce_scatter(shard, rs_size, link)
        fsdp_total = n_ag * t_ag + n_rs * t_rs
        per_unit = 1 / (layers + 1)
        fsdp_edge = (t_ag + t_rs) * per_unit
        out.append(Collective("fsdp", "all_gather", shard, ag_size, link.name, n_ag, n_ag * t_ag))
        out.append(Collective("fsdp", "reduce_scatter", shard, rs_size, link.name, n_rs, n_rs * t_rs))
    if plan.dp_replicate > 1:
        link = _group_link(c, plan.device, sh.rpn, p, plan.dp_replicate, shard * tp)
        size = stage_params * REDUCE_BYTES / shard
        n_ar = 1 if pp > 1 else n_mb
        t_ar = comm.all_reduce(plan.dp_replicate, size, link)
        hsdp_total = n_ar * t_ar
        fsdp_edge += t_ar / (layers + 1)
        out.append(Collective("hsdp", "all_reduce", plan.dp_replicate, size, link.name, n_ar, hsdp_total))
    return fsdp_total, hsdp_total, fsdp_edge


def _overlap(
    p: PerfParams, sh: _Shape, fsdp_total: float, hsdp_total: float, fsdp_edge: float, window: float
) -> tuple[float, float, float, float]:
    """Data-parallel collectives overlap the compute window: (exposed, its
    FSDP and HSDP shares, the slowdown of compute by the hidden part)."""
    overlappable = fsdp_total + hsdp_total
    exposed_dp = fsdp_edge + max(0.0, overlappable - fsdp_edge - window) if overlappable else 0.0
    if sh.cpu:
        exposed_dp = overlappable  # CPU collectives are CPU work: nothing hides them
    hidden = overlappable - exposed_dp
    interference = p.overlap_slowdown * hidden
    # Split the exposed data-parallel time between fsdp and hsdp by share.
    fsdp_exposed = exposed_dp * (fsdp_total / overlappable) if overlappable else 0.0
    hsdp_exposed = exposed_dp - fsdp_exposed
    return exposed_dp, fsdp_exposed, hsdp_exposed, interference


def _prediction(
    cfg: RunConfig, plan: Layout, p: PerfParams, d: _Device, sh: _Shape, breakdown: dict[str, float]
) -> Prediction:
    """Throughput, MFU and uncertainty of a step whose terms are ``breakdown``."""
    step = sum(breakdown.values())
    tokens_step = plan.global_batch_size * sh.s
    tps = tokens_step / step
    tps_gpu = tps / plan.world_size
    hw_per_token = plan.flops_per_token + recompute_flops_per_token(cfg.model, sh.ac)
    nominal_peak = d.peak if sh.cpu else plan.gpu_peak_bf16_tflops * 1e12
    notes: list[str] = []
    unc = p.base_uncertainty_pct
    b = breakdown
    exposed_comm = b["fsdp"] + b["hsdp"] + b["tp"] + b["cp"] + b["pp_p2p"]
    if exposed_comm > 0.25 * step:
        unc += 10
        notes.append(f"communication-bound: {exposed_comm / step:.0%} of the step is exposed communication")
    if sh.pp > 1:
        unc += 5
    if sh.cpu and not p.provenance.get("cpu", "").startswith("fit"):
        unc += 35
    if sh.vit:
        unc += 10
    return Prediction(
        step_time_s=step,
        tokens_per_step=tokens_step,
        tokens_per_s=tps,
        tokens_per_s_per_gpu=tps_gpu,
        mfu=plan.flops_per_token * tps_gpu / nominal_peak,
        hfu=hw_per_token * tps_gpu / nominal_peak,
        peak_tflops=nominal_peak / 1e12,
        world_size=plan.world_size,
        breakdown=breakdown,
        comm_total_s={},
        uncertainty_pct=unc,
        notes=notes,
        params_source=p.source,
        device_source=d.source,
    )
