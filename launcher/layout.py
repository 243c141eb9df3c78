"""The parallel layout of a run: what the performance model needs to price a
step, shared by the planner (which chooses one) and the model (which prices
any one). A bottom-layer module: it imports nothing from launcher."""

from __future__ import annotations

from dataclasses import dataclass


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

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard
