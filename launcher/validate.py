"""Field-level checks on a composed run, before any planning.

Every failure is a :class:`ConfigError` naming the field, the bad value and
the valid choices or range, so the CLI can print one line and exit non-zero.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from launcher.schema import RunConfig


class ConfigError(ValueError):
    """A user error in the composed configuration."""


def fail(field: str, value: Any, expected: str) -> ConfigError:
    return ConfigError(f"{field}={value!r} is invalid: {expected}")


# Fields that must be >= 1 (sizes and counts).
POSITIVE = {
    "cluster": ["nodes", "local_processes", "cpus_per_node"],
    "model": ["dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size", "seq_len"],
    "train": ["steps", "log_every_steps"],
    "storage": ["save_every_steps", "keep_local", "keep_remote"],
    "qos": ["time_limit_min"],
}
# Fields that must be >= 0 (0 usually means "let the planner choose").
NON_NEGATIVE = {
    "cluster": ["gpus_per_node", "gpu_mem_gb", "gpu_peak_bf16_tflops"],
    "parallelism": ["dp_replicate", "dp_shard", "tp", "pp", "pp_microbatches"],
    "train": ["global_batch_size", "micro_batch_size", "warmup_steps", "lr", "target_tokens", "grad_clip"],
    "storage": ["save_every_min", "upload_timeout_min"],
    "launcher": ["max_restarts", "signal_lead_s", "cpus_per_task", "mem_gb", "master_port"],
}


def check_choices(cfg: RunConfig) -> None:
    """Mode fields carry their valid values in dataclass metadata."""
    for group in dataclasses.fields(cfg):
        node = getattr(cfg, group.name)
        for f in dataclasses.fields(node):
            choices = f.metadata.get("choices")
            value = getattr(node, f.name)
            if choices and value not in choices:
                raise fail(f"{group.name}.{f.name}", value, f"choose one of {', '.join(choices)}")


def check_ranges(cfg: RunConfig) -> None:
    for group, names in POSITIVE.items():
        for name in names:
            value = getattr(getattr(cfg, group), name)
            if value < 1:
                raise fail(f"{group}.{name}", value, "must be >= 1")
    for group, names in NON_NEGATIVE.items():
        for name in names:
            value = getattr(getattr(cfg, group), name)
            if value < 0:
                raise fail(f"{group}.{name}", value, "must be >= 0 (0 lets meshrun choose)")
    if cfg.parallelism.stages_per_rank < 1:
        raise fail("parallelism.stages_per_rank", cfg.parallelism.stages_per_rank, "must be >= 1")
    if cfg.train.lr <= 0:
        raise fail("train.lr", cfg.train.lr, "must be > 0")


def check_model(cfg: RunConfig) -> None:
    m = cfg.model
    if m.dim % m.n_heads:
        raise fail("model.n_heads", m.n_heads, f"must divide model.dim={m.dim}")
    if m.n_heads % m.n_kv_heads:
        raise fail("model.n_kv_heads", m.n_kv_heads, f"must divide model.n_heads={m.n_heads}")
    if (m.dim // m.n_heads) % 2:
        raise fail("model.n_heads", m.n_heads, "head_dim (dim / n_heads) must be even for RoPE")
    if m.family == "vit" and m.image_size % m.patch_size:
        raise fail("model.patch_size", m.patch_size, f"must divide model.image_size={m.image_size}")


def check_cluster(cfg: RunConfig) -> None:
    c = cfg.cluster
    if c.kind == "slurm":
        if c.gpus_per_node < 1:
            raise fail("cluster.gpus_per_node", c.gpus_per_node, "must be >= 1 on a Slurm cluster")
        if c.gpu_mem_gb <= 0:
            raise fail("cluster.gpu_mem_gb", c.gpu_mem_gb, "must be > 0 on a Slurm cluster")
    elif c.nodes != 1:
        raise fail("cluster.nodes", c.nodes, "cluster=local runs on this machine: must be 1")
    if c.container_image and not c.pyxis:
        raise fail(
            "cluster.container_image",
            c.container_image,
            "needs Pyxis on the cluster (cluster.pyxis=true); unset it to run without a container",
        )


def check_storage(cfg: RunConfig) -> None:
    s = cfg.storage
    if s.s3_required and not s.s3_bucket:
        raise fail(
            "storage.s3_bucket",
            s.s3_bucket,
            f"storage={s.name} uploads to S3: set storage.s3_bucket=<bucket> (or choose storage=local)",
        )
    if cfg.parallelism.offload_params:
        raise fail(
            "parallelism.offload_params",
            True,
            "meshrun never offloads parameters (it stalls every step on PCIe); "
            "shard more (more GPUs, parallelism.pp) or use activation checkpointing",
        )


def check_data(cfg: RunConfig) -> None:
    d = cfg.data
    if d.kind != "synthetic" and not d.path:
        raise fail("data.path", d.path, f"data={d.name} reads files: set data.path=<dir>")
    if d.kind == "images" and cfg.model.family != "vit":
        raise fail("model.family", cfg.model.family, "data=images needs an image model (family=vit)")
    if d.kind != "images" and cfg.model.family == "vit":
        raise fail("data.kind", d.kind, "a vit model needs data=images")


def validate(cfg: RunConfig) -> None:
    """Run all field-level checks; layout checks happen in the planner."""
    check_choices(cfg)
    check_ranges(cfg)
    check_model(cfg)
    check_cluster(cfg)
    check_storage(cfg)
    check_data(cfg)
