"""Parallel dims: one DeviceMesh with named dims (pp, dp_replicate, dp_shard,
cp, tp; outermost first, tp innermost so it stays on NVLink; torchtitan's order) built from the
Plan's degrees, checked against the world size before any process group
exists, with sub-meshes handed out by name."""

from __future__ import annotations

from dataclasses import dataclass

from launcher.config.plandata import Plan
from launcher.config.schema import ModelConfig
from launcher.config.validate import ConfigError, fail


@dataclass(frozen=True)
class ParallelDims:
    pp: int
    dp_replicate: int
    dp_shard: int
    tp: int
    world_size: int
    cp: int = 1  # context parallel: ranks sharing one sequence

    @classmethod
    def from_plan(cls, plan: Plan, world_size: int) -> ParallelDims:
        d = plan.mesh_dims()
        return cls(d["pp"], d["dp_replicate"], d["dp_shard"], d["tp"], world_size, cp=d["cp"])

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    def names(self) -> dict[str, int]:
        return {
            "pp": self.pp,
            "dp_replicate": self.dp_replicate,
            "dp_shard": self.dp_shard,
            "cp": self.cp,
            "tp": self.tp,
        }

    def validate(self, model: ModelConfig, stages_per_rank: int = 1, compile: bool = False) -> None:
        """The checks the planner does, repeated here because a spec can be
        written by hand or the job started with the wrong task count."""
        for name, value in self.names().items():
            if value < 1:
                raise fail(f"parallelism.{name}", value, "must be >= 1 once planned")
        product = self.pp * self.dp_replicate * self.dp_shard * self.cp * self.tp
        if product != self.world_size:
            raise ConfigError(
                f"parallel layout pp={self.pp} x dp_replicate={self.dp_replicate} x "
                f"dp_shard={self.dp_shard} x cp={self.cp} x tp={self.tp} = {product} ranks does not match "
                f"the {self.world_size} ranks this job started (WORLD_SIZE / SLURM_NTASKS); "
                "re-plan for this world size or start the job with the planned task count"
            )
        if model.n_heads % self.tp or model.n_kv_heads % self.tp:
            raise fail(
                "parallelism.tp",
                self.tp,
                f"must divide model.n_heads={model.n_heads} and model.n_kv_heads={model.n_kv_heads}",
            )
        if model.ffn_dim % self.tp or model.vocab_size % self.tp:
            raise fail(
                "parallelism.tp",
                self.tp,
                f"must divide model.ffn_dim={model.ffn_dim} and model.vocab_size={model.vocab_size}",
            )
        if self.tp > 1 and model.seq_len % self.tp:
            raise fail(
                "parallelism.tp",
                self.tp,
                f"sequence parallel needs it to divide model.seq_len={model.seq_len}",
            )
        if self.cp > 1 and model.seq_len % (2 * self.cp * self.tp):
            raise fail(
                "parallelism.cp",
                self.cp,
                f"2 x cp x tp must divide model.seq_len={model.seq_len} (load-balanced ring attention)",
            )
        if self.cp > 1 and self.pp > 1:
            raise fail("parallelism.cp", self.cp, "context parallel does not compose with pp > 1 here")
        if self.pp * stages_per_rank > model.n_layers:
            raise fail(
                "parallelism.pp",
                self.pp,
                f"pp x stages_per_rank = {self.pp * stages_per_rank} exceeds model.n_layers={model.n_layers}",
            )

    def build_mesh(self, device_type: str):
        """(world DeviceMesh, flattened "dp" mesh of all data-parallel ranks,
        for data sharding)."""
        from torch.distributed.device_mesh import init_device_mesh

        names = tuple(self.names())
        mesh = init_device_mesh(device_type, tuple(self.names().values()), mesh_dim_names=names)
        dp = mesh["dp_replicate", "dp_shard"]._flatten("dp")
        return mesh, dp


def dp_mesh_for_fsdp(mesh, dims: ParallelDims, precision: str = "fp32"):
    """FSDP's mesh: 2-D (replicate, shard) is HSDP, 1-D shard is FSDP. None
    when there is no data parallelism, except for bf16: FSDP on a 1-rank dim
    then gives the same bf16-params / fp32-reduce numerics as every other
    layout (instead of autocast's different casting rules). Context-parallel
    ranks hold the same parameters and their gradients are summed like data
    parallel ones: FSDP shards over dp_shard x cp (torchtitan's dp_shard_cp)."""
    if dims.dp == 1 and dims.cp == 1 and precision != "bf16":
        return None
    if dims.cp > 1:
        mesh["dp_shard", "cp"]._flatten("dp_shard_cp")
        return mesh["dp_replicate", "dp_shard_cp"] if dims.dp_replicate > 1 else mesh["dp_shard_cp"]
    if dims.dp_replicate > 1:
        return mesh["dp_replicate", "dp_shard"]
    return mesh["dp_shard"]
