"""The layouts worth trying for a run: ranks per node, candidate degrees per
parallel dimension (tensor, pipeline, data: replicate x shard) in the order
:mod:`launcher.plan.planner` prefers them, and batch splits. The size
thresholds of ``parallelism=auto`` are here."""

from __future__ import annotations

from dataclasses import dataclass

from launcher.config.schema import RunConfig
from launcher.config.validate import fail

SMALL_MODEL_PARAMS = 6.5e9  # "under 7B" (Llama 2 7B has 6.74B parameters)
LARGE_MODEL_PARAMS = 80e9  # "above 70B" (Llama 3.1 70B has 70.6B)
MIN_GPUS_FOR_PP_MODELS = 32
AC_ORDER = ("none", "selective", "full")
AUTO_MIN_BATCH = 8  # sequences per step on CPU when train.global_batch_size=0
MIN_PREDICTED_GAIN = 1.10  # leave the preference order only for a clear predicted win
AUTO_SEQS_PER_GPU = 2  # on GPUs when train.global_batch_size=0
INFERENCE_KINDS = ("eval", "generate")


@dataclass
class Choice:
    tp: int
    pp: int
    dp_replicate: int
    dp_shard: int
    ac: str
    cp: int = 1


def ranks_per_node(cfg: RunConfig) -> tuple[int, str]:
    """(ranks on each node, device). A local run with GPUs uses them all."""
    c = cfg.cluster
    if c.kind == "local" and c.gpus_per_node == 0:
        return c.local_processes, "cpu"
    if c.gpus_per_node == 0:  # CPU work on Slurm (job=script only: validate.check_cluster): one task a node
        return 1, "cpu"
    if c.device == "cpu":  # one CPU rank per (placeholder) GPU, e.g. the test cluster
        return c.gpus_per_node, "cpu"
    return c.gpus_per_node, "cuda"


def _divisors_desc(n: int, cap: int) -> list[int]:
    return [d for d in range(min(n, cap), 0, -1) if n % d == 0]


def candidate_tp(cfg: RunConfig, rpn: int, mode: str, size: int) -> list[int]:
    p, m = cfg.parallelism, cfg.model
    if p.tp:
        return [p.tp]
    if mode in ("fsdp", "hsdp"):
        return [1]
    if mode == "auto" and size < SMALL_MODEL_PARAMS:
        return [1]
    # Largest TP that fits inside a node (NVLink), at most 8, dividing the heads.
    fits = [t for t in _divisors_desc(rpn, 8) if m.n_heads % t == 0 and m.n_kv_heads % t == 0]
    return fits[:1] or [1]


def candidate_pp(cfg: RunConfig, world: int, tp: int, mode: str, size: int) -> list[int]:
    p = cfg.parallelism
    if p.pp:
        return [p.pp]
    if mode in ("fsdp", "hsdp", "fsdp_tp"):
        return [1]
    if mode == "auto" and size < LARGE_MODEL_PARAMS:
        return [1]
    rest = world // tp if world % tp == 0 else 0
    options = [d for d in range(2, rest + 1) if rest % d == 0 and d <= cfg.model.n_layers]
    return options or [1]


def candidate_dp(cfg: RunConfig, world: int, rpn: int, tp: int, pp: int, mode: str) -> list[tuple[int, int]]:
    """(dp_replicate, dp_shard) pairs, most replication first."""
    p = cfg.parallelism
    if world % (tp * pp):
        return [(0, 0)]  # rejected with a clear message by _check_layout
    dp = world // (tp * pp)
    if p.dp_replicate and p.dp_shard:
        return [(p.dp_replicate, p.dp_shard)]
    if p.dp_shard:
        return [(dp // p.dp_shard if dp % p.dp_shard == 0 else 0, p.dp_shard)]
    if p.dp_replicate:
        return [(p.dp_replicate, dp // p.dp_replicate if dp % p.dp_replicate == 0 else 0)]
    if mode == "fsdp":
        return [(1, dp)]
    # Shard inside a node, replicate across nodes; shard wider if memory needs.
    inside = max(1, min(dp, rpn // tp)) if cfg.cluster.nodes > 1 or mode == "hsdp" else dp
    pairs = []
    shard = inside
    while shard <= dp:
        if dp % shard == 0:
            pairs.append((dp // shard, shard))
        shard *= 2
    if (1, dp) not in pairs:
        pairs.append((1, dp))
    return pairs


def split_batches(cfg: RunConfig, dp: int, tp: int, pp: int, device: str) -> list[tuple[int, int, int]]:
    """(micro_batch_size, grad_accum_steps, pp_microbatches) candidates, the
    largest micro batch first; smaller ones trade memory for accumulation."""
    t, p = cfg.train, cfg.parallelism
    gbs = global_batch_size(cfg, dp, tp, pp, device)
    if gbs % dp:
        raise fail("train.global_batch_size", gbs, f"must be divisible by the data-parallel degree {dp}")
    local = gbs // dp
    if pp > 1:
        # Default: one sequence per microbatch (smallest bubble and activations).
        n_mb = p.pp_microbatches or local
        if local % n_mb:
            raise fail(
                "parallelism.pp_microbatches",
                n_mb,
                f"must divide the per-replica batch {local} (global_batch_size / dp)",
            )
        return [(local // n_mb, 1, n_mb)]
    if t.micro_batch_size:
        if local % t.micro_batch_size:
            raise fail(
                "train.micro_batch_size", t.micro_batch_size, f"must divide the per-replica batch {local}"
            )
        return [(t.micro_batch_size, local // t.micro_batch_size, 1)]
    return [(mbs, local // mbs, 1) for mbs in range(local, 0, -1) if local % mbs == 0]


def global_batch_size(cfg: RunConfig, dp: int, tp: int = 1, pp: int = 1, device: str = "cpu") -> int:
    """train.global_batch_size, or (0) a default that keeps every GPU busy:
    2 sequences per GPU of each replica on GPUs (tp x pp GPUs share one
    replica's batch), the smallest multiple of dp >= 8 on CPU."""
    if cfg.train.global_batch_size:
        return cfg.train.global_batch_size
    if device == "cuda":
        return dp * AUTO_SEQS_PER_GPU * tp * pp
    return dp * -(-AUTO_MIN_BATCH // dp)


def ranks_field(cfg: RunConfig) -> str:
    """The field that sets the ranks per node, for messages."""
    c = cfg.cluster
    return (
        "cluster.local_processes" if c.kind == "local" and c.gpus_per_node == 0 else "cluster.gpus_per_node"
    )


def degree_fields(cfg: RunConfig, lay: Choice) -> str:
    """ "parallelism.tp=8 (chosen)"-style text: which degrees the user set."""
    p = cfg.parallelism
    parts = []
    for name, value in (("tp", lay.tp), ("pp", lay.pp)):
        parts.append(f"parallelism.{name}={value}" + ("" if getattr(p, name) else " (chosen by the planner)"))
    return " x ".join(parts)
