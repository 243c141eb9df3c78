"""Memory per GPU of a layout: parameters, gradients, optimizer state,
activations (with and without activation checkpointing) and overhead.

Approximations, documented so they can be checked against a measured run:
- FSDP2 with bf16 mixed precision keeps fp32 sharded parameters (4 B),
  fp32 sharded gradients (4 B) and AdamW's two fp32 moments (8 B): 16 bytes
  per sharded parameter. Two blocks are unsharded at a time (the current
  one and the prefetched next), with their unsharded gradients.
- Activations per token per block, in elements, for a Llama block with
  SDPA/flash attention (no s^2 score matrix): 7*dim + 2*kv_dim + 4*ffn
  without checkpointing, 5*dim + 2*kv_dim + 2*ffn with op-level selective
  checkpointing, and the block input (dim) with full checkpointing plus one
  block's full set during its recompute. Sequence parallel divides all of
  it by tp, context parallel by cp (each rank holds seq_len / cp tokens of
  every sequence; K and V blocks passed around the ring are transient).
- Context parallel ranks hold the same parameters: FSDP shards them over
  dp_shard x cp (train/parallel/mesh.py).
- Pipeline schedules keep several microbatches in flight on the first stage:
  pp for 1F1B-style schedules, all of them for GPipe.
- A GPU's HBM is not all usable: the CUDA context, NCCL's buffers and the
  caching allocator's fragmentation take a reserve per GPU type
  (conf/perf/default.yaml: ``gpus.<type>.hbm_reserve_gb`` +
  ``hbm_fragmentation`` x HBM; ``cluster.gpu_mem_reserve_gb`` overrides),
  counted as the overhead term (:func:`runtime_reserve`).
- Float8 (train.float8, torchao): the sharded fp32 state is unchanged and
  Float8Linear saves its high-precision input for backward (activations
  unchanged). tensorwise with FSDP2 all-gathers the block weights in float8:
  1 byte per unsharded parameter instead of 2 (bf16); rowwise gathers them
  in the compute precision and casts them per GEMM, a float8 copy and its
  transpose (2 bytes) beside it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from launcher.config.plandata import MemoryEstimate
from launcher.config.schema import ModelConfig
from launcher.perf.flops import param_counts, tokens_per_sample

if TYPE_CHECKING:
    from launcher.config.schema import ClusterConfig, RunConfig
    from launcher.perf import PerfParams
    from launcher.plan.candidates import Choice

GB = 1e9
CPU_OVERHEAD_GB = 0.5  # a CPU rank's Python + torch runtime (resident set)
BYTES_PER_SHARDED_PARAM = 16  # fp32 param + fp32 grad + 2 fp32 Adam moments


def _activation_elems_per_token(m: ModelConfig, ac: str) -> float:
    kv_dim = m.n_kv_heads * (m.dim // m.n_heads)
    if m.family == "vit":
        kv_dim = m.dim
    if ac == "full":
        return m.dim
    if ac == "selective":
        return 5 * m.dim + 2 * kv_dim + 2 * m.ffn_dim
    return 7 * m.dim + 2 * kv_dim + 4 * m.ffn_dim


def runtime_reserve(
    c: ClusterConfig, device: str, capacity_gb: float, perf_params: PerfParams | None = None
) -> tuple[float, str]:
    """(GB per rank the planner keeps free of tensors, how it is made up).
    GPUs: the CUDA context and NCCL buffers of the GPU type plus the
    allocator's fragmentation share, or ``cluster.gpu_mem_reserve_gb`` when
    set; CPU ranks: the Python + torch runtime. 0 when memory is not checked."""
    if capacity_gb <= 0:
        return 0.0, ""
    if device != "cuda":
        return CPU_OVERHEAD_GB, "Python + torch runtime of a CPU rank"
    if c.gpu_mem_reserve_gb > 0:
        return c.gpu_mem_reserve_gb, "set by you (cluster.gpu_mem_reserve_gb)"
    from launcher.perf import load_params

    p = perf_params or load_params()
    fixed, frag = p.gpu(c.gpu_type).hbm_reserve_gb, p.hbm_fragmentation * capacity_gb
    return fixed + frag, (
        f"{c.gpu_type}: CUDA context + NCCL buffers {fixed:g} GB, fragmentation "
        f"{p.hbm_fragmentation:.0%} of {capacity_gb:g} GB (conf/perf/default.yaml; "
        "cluster.gpu_mem_reserve_gb overrides)"
    )


def memory_figure(c: ClusterConfig, device: str, mem: MemoryEstimate) -> tuple[float, float]:
    """The plan's one memory figure: (GB the run's tensors use per rank, GB it
    may use: capacity less the runtime reserve; 0 when memory is unchecked).
    The dry run's title and table and the sweep table all show this pair."""
    reserve_gb, _ = runtime_reserve(c, device, mem.capacity_gb)
    usable = mem.capacity_gb - reserve_gb if mem.capacity_gb else 0.0
    return mem.total_gb - mem.overhead_gb, usable


def unsharded_param_bytes(float8: str, act_bytes: int) -> float:
    """Bytes of one unsharded (all-gathered) block parameter while it is used."""
    if float8 == "tensorwise":
        return 1.0  # gathered in float8
    if float8 == "rowwise":
        return act_bytes + 2.0  # + the per-GEMM float8 copy and its transpose
    return act_bytes


def inflight_microbatches(pp: int, schedule: str, n_microbatches: int) -> int:
    if pp <= 1:
        return 1
    if schedule == "gpipe":
        return n_microbatches
    return min(pp, n_microbatches)


def estimate_memory(
    m: ModelConfig,
    *,
    tp: int,
    pp: int,
    dp_shard: int,
    stages_per_rank: int,
    micro_batch_size: int,
    n_microbatches: int,
    pp_schedule: str,
    activation_checkpointing: str,
    precision: str,
    capacity_gb: float,
    overhead_gb: float,
    float8: str = "off",
    cp: int = 1,
) -> MemoryEstimate:
    """``overhead_gb``: the runtime reserve (:func:`runtime_reserve`);
    ``float8``: train.float8's recipe; ``cp``: the context-parallel degree."""
    pc = param_counts(m)
    n_stages = pp * stages_per_rank
    layers_per_rank = math.ceil(m.n_layers / n_stages) * stages_per_rank
    # The first stage also holds the embedding, the last the output head; size
    # for the heavier of the two (both when there is no pipeline).
    edge = pc.embedding + pc.output if pp == 1 else max(pc.embedding, pc.output)
    rank_params = (layers_per_rank * pc.per_layer + edge) / tp
    sharded = rank_params / (dp_shard * cp)
    act_bytes = 2 if precision == "bf16" else 4

    params_gb = sharded * 4 / GB
    grads_gb = sharded * 4 / GB
    optimizer_gb = sharded * 8 / GB
    unsharded_gb = 2 * (pc.per_layer / tp) * (unsharded_param_bytes(float8, act_bytes) + act_bytes) / GB

    tokens = micro_batch_size * tokens_per_sample(m) / cp
    inflight = inflight_microbatches(pp, pp_schedule, n_microbatches)

    def activations(ac: str) -> float:
        per_block = _activation_elems_per_token(m, ac) * tokens * act_bytes / tp
        total = per_block * layers_per_rank * inflight
        if ac == "full":  # one block is rematerialised in full during backward
            total += _activation_elems_per_token(m, "none") * tokens * act_bytes / tp
        # Logits (bf16), their fp32 copy for the loss and its gradient.
        head_out = m.num_classes if m.family == "vit" else m.vocab_size
        per_sample = 1 if m.family == "vit" else tokens_per_sample(m) / cp
        total += micro_batch_size * per_sample * head_out / tp * (act_bytes + 8)
        return total / GB

    return MemoryEstimate(
        params_gb=params_gb,
        grads_gb=grads_gb,
        optimizer_gb=optimizer_gb,
        unsharded_gb=unsharded_gb,
        activations_gb=activations(activation_checkpointing),
        activations_no_ac_gb=activations("none"),
        overhead_gb=overhead_gb,
        capacity_gb=capacity_gb,
    )


def train_memory(
    cfg: RunConfig, lay: Choice, batch: tuple[int, int, int], precision: str, capacity: float, reserve: float
) -> MemoryEstimate:
    """estimate_memory of the planner's candidate ``lay`` (degrees and
    activation checkpointing) with ``batch`` (micro batch, accumulation,
    pipeline microbatches)."""
    p = cfg.parallelism
    return estimate_memory(
        cfg.model,
        tp=lay.tp,
        cp=lay.cp,
        pp=lay.pp,
        dp_shard=lay.dp_shard,
        stages_per_rank=p.stages_per_rank if lay.pp > 1 else 1,
        micro_batch_size=batch[0],
        n_microbatches=batch[2],
        pp_schedule=p.pp_schedule,
        activation_checkpointing=lay.ac,
        precision=precision,
        capacity_gb=capacity,
        overhead_gb=reserve,
        float8=cfg.train.float8,
    )


def estimate_inference_memory(
    m: ModelConfig,
    *,
    kind: str,
    tp: int,
    pp: int,
    micro_batch_size: int,
    kv_sequences: int,
    kv_tokens: int,
    precision: str,
    capacity_gb: float,
    overhead_gb: float,
) -> MemoryEstimate:
    """Memory per rank of job=eval / job=generate: no gradients, no optimizer
    state. Weights in the compute precision, split by tp and pp (FSDP over
    the data-parallel ranks of an eval only lowers it: not counted, so the
    estimate errs high). generate: the KV cache of ``kv_sequences`` sequences
    in flight of up to ``kv_tokens`` tokens (k and v, every layer, this
    rank's kv heads); activations of one block's forward at a time (nothing
    is kept for a backward) over a prefill of those sequences (generate) or
    a micro batch (eval), plus the logits: every position's for eval's loss
    (fp32 and its softmax), the last position's for generate."""
    pc = param_counts(m)
    layers = math.ceil(m.n_layers / pp)
    edge = pc.embedding + pc.output if pp == 1 else max(pc.embedding, pc.output)
    nbytes = 2 if precision == "bf16" else 4
    kv_dim = m.n_kv_heads * (m.dim // m.n_heads)
    params_gb = (layers * pc.per_layer + edge) / tp * nbytes / GB
    kv_gb = 0.0
    if kind == "generate":
        kv_gb = kv_sequences * kv_tokens * layers * 2 * kv_dim / tp * nbytes / GB
        tokens, logit_rows = kv_sequences * m.seq_len, kv_sequences
    else:
        tokens = micro_batch_size * m.seq_len
        logit_rows = tokens
    block = (3 * m.dim + (2 * m.dim + 2 * kv_dim + 3 * m.ffn_dim) / tp) * tokens * nbytes
    logits = logit_rows * m.vocab_size * (nbytes + 8)  # replicated (all-gathered) on every TP rank
    return MemoryEstimate(
        params_gb=params_gb,
        grads_gb=0.0,
        optimizer_gb=0.0,
        unsharded_gb=0.0,
        activations_gb=(block + logits) / GB,
        activations_no_ac_gb=(block + logits) / GB,
        overhead_gb=overhead_gb,
        capacity_gb=capacity_gb,
        kv_cache_gb=kv_gb,
    )
