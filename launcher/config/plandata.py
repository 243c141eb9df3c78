"""The plan's data, as the trainer and every tool read it: the parallel
layout (what the performance model prices), the memory and cost estimates,
and the stop margin of a signal window. Data only: the planner
(launcher/plan/) fills it, spec.json carries it, nothing here plans."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from launcher.config.saveauto import SaveAuto

# Kept back from a window for the ranks to exit and the batch script to
# requeue (at most a quarter of a short window).
STOP_MARGIN_S = 10.0


def stop_margin_s(window_s: float) -> float:
    return min(STOP_MARGIN_S, 0.25 * window_s)


# Peer copies a rank keeps of each kind (its own, its partner's) under
# launcher.in_process_recovery: the newest and the one before, so a fault
# during an exchange still leaves a step every rank holds
# (train/inprocess/peerstate.py; launcher/plan/make.py sizes host memory by it).
PEER_COPIES_KEPT = 2


@dataclass
class Layout:
    world_size: int
    nodes: int
    ranks_per_node: int
    device: str  # "cuda" or "cpu"
    dp_replicate: int
    dp_shard: int
    tp: int
    pp: int
    stages_per_rank: int
    pp_schedule: str
    pp_microbatches: int
    global_batch_size: int
    micro_batch_size: int  # samples per forward on one data-parallel rank
    grad_accum_steps: int
    activation_checkpointing: str
    precision: str
    compile: bool
    flops_per_token: float
    gpu_peak_bf16_tflops: float
    # Context-parallel degree (sequence shards); keyword-only with a default
    # so that specs written before it still load.
    cp: int = field(default=1, kw_only=True)

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard


@dataclass
class MemoryEstimate:
    params_gb: float
    grads_gb: float
    optimizer_gb: float
    unsharded_gb: float  # all-gathered blocks in flight
    activations_gb: float
    activations_no_ac_gb: float
    overhead_gb: float
    capacity_gb: float  # GPU memory, or host RAM / ranks per node on CPU; 0: not checked
    kv_cache_gb: float = 0.0  # job=generate: this rank's heads of the KV cache

    @property
    def total_gb(self) -> float:
        return (
            self.params_gb
            + self.grads_gb
            + self.optimizer_gb
            + self.unsharded_gb
            + self.activations_gb
            + self.kv_cache_gb
            + self.overhead_gb
        )

    @property
    def fits(self) -> bool:
        return self.capacity_gb <= 0 or self.total_gb <= self.capacity_gb

    def terms(self) -> dict[str, float]:
        """The parts of total_gb, by the name a message shows."""
        return {
            "parameters": self.params_gb,
            "gradients": self.grads_gb,
            "optimizer state": self.optimizer_gb,
            "activations": self.activations_gb,
            "unsharded blocks in flight": self.unsharded_gb,
            "KV cache": self.kv_cache_gb,
            "runtime overhead": self.overhead_gb,
        }

    def biggest(self) -> tuple[str, float]:
        """(name, GB) of the largest term."""
        return max(self.terms().items(), key=lambda kv: kv[1])

    def to_dict(self) -> dict[str, float]:
        d = asdict(self)
        d["total_gb"] = self.total_gb
        return d


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
    # Where tokens/s came from: "perf model" or "fixed MFU".
    basis: str = "perf model"
    # Optimizer steps of those tokens (train.steps, or train.target_tokens
    # over the planned tokens per step).
    steps: float = 0.0
    spare_nodes: int = 0  # priced beside the training nodes: the job holds them throughout

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Plan(Layout):
    """Everything downstream (render, submit, train, cost) reads this: the
    chosen layout (launcher/config/plandata.py) and what the planner found about it."""

    backend: str  # "nccl" or "gloo"
    mode: str  # resolved: fsdp | hsdp | fsdp_tp | fsdp_tp_pp
    params: int
    memory: MemoryEstimate
    cost: CostEstimate | None
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # USR2 seconds before the time limit (Slurm runs; launcher/plan/stopping.py).
    signal_lead_s: int = 0
    # CPU ranks: GFLOP/s per rank the logged MFU divides by (the planner's
    # host probe, launcher/perf/cpu_peak.py); 0: unknown, no MFU logged.
    cpu_rank_peak_gflops: float = 0.0
    # storage.save_every_steps=auto: the first interval and its inputs
    # (launcher/plan/forecast.py); None for a fixed interval.
    save_auto: SaveAuto | None = None

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self._seq_len

    _seq_len: int = 0

    def mesh_dims(self) -> dict[str, int]:
        """Named DeviceMesh dims, outermost first (tp innermost = NVLink; cp
        next to it, torchtitan's order: its ring passes stay inside a node
        when they can)."""
        return {
            "pp": self.pp,
            "dp_replicate": self.dp_replicate,
            "dp_shard": self.dp_shard,
            "cp": self.cp,
            "tp": self.tp,
        }

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["memory"] = self.memory.to_dict()
        d["dp"] = self.dp
        d.pop("_seq_len")
        d["tokens_per_step"] = self.tokens_per_step
        return d
