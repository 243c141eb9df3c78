"""Ranks from the environment (torchrun, the local launcher or a Slurm task)
and the process group: NCCL on GPUs, gloo on CPU, from the same code."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    device: str  # "cuda:<local_rank>" or "cpu"
    backend: str  # "nccl" or "gloo"
    master_addr: str
    master_port: int
    # Filled in once the DeviceMesh exists: this rank's index in the flattened
    # data-parallel dim and its size (data loaders shard by these).
    dp_rank: int = 0
    dp_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(env: dict[str, str], *names: str, default: int | None = None) -> int:
    for name in names:
        if env.get(name, "") != "":
            return int(env[name])
    if default is None:
        raise ValueError(f"none of the environment variables {', '.join(names)} is set")
    return default


def _slurm_tasks_per_node(env: dict[str, str]) -> int:
    # SLURM_TASKS_PER_NODE looks like "4(x2)" or "4,3"; the first count is ours
    # on homogeneous allocations, which is what meshrun submits.
    if env.get("SLURM_NTASKS_PER_NODE"):
        return int(env["SLURM_NTASKS_PER_NODE"])
    spec = env.get("SLURM_TASKS_PER_NODE", "")
    if spec:
        return int(spec.split(",")[0].split("(")[0])
    return _env_int(env, "SLURM_NTASKS") // _env_int(env, "SLURM_NNODES", "SLURM_JOB_NUM_NODES", default=1)


def dist_info_from_env(device_kind: str, env: dict[str, str] | None = None) -> DistInfo:
    """Read ranks; torchrun-style variables win over Slurm's (srun inside an
    allocation started by torchrun is not a case meshrun creates)."""
    env = dict(os.environ if env is None else env)
    if "RANK" in env and "WORLD_SIZE" in env:
        rank = int(env["RANK"])
        world = int(env["WORLD_SIZE"])
        local_rank = _env_int(env, "LOCAL_RANK", default=rank)
        local_world = _env_int(env, "LOCAL_WORLD_SIZE", default=world)
        node_rank = _env_int(env, "GROUP_RANK", "NODE_RANK", default=rank // max(local_world, 1))
    elif "SLURM_PROCID" in env:
        rank = int(env["SLURM_PROCID"])
        world = _env_int(env, "SLURM_NTASKS")
        local_rank = _env_int(env, "SLURM_LOCALID")
        local_world = _slurm_tasks_per_node(env)
        node_rank = _env_int(env, "SLURM_NODEID", default=rank // local_world)
    else:  # a plain `python -m train run_dir`: one process
        rank, world, local_rank, local_world, node_rank = 0, 1, 0, 1, 0
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside the world size {world}")
    if device_kind == "cuda":
        # One visible GPU per task (srun --gpus-per-task) means cuda:0, not
        # cuda:<local rank>.
        visible = torch.cuda.device_count()
        device, backend = f"cuda:{local_rank % visible if visible else local_rank}", "nccl"
    else:
        device, backend = "cpu", "gloo"
    return DistInfo(
        rank=rank,
        world_size=world,
        local_rank=local_rank,
        local_world_size=local_world,
        node_rank=node_rank,
        device=device,
        backend=backend,
        master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
        master_port=int(env.get("MASTER_PORT", "0") or 0),
    )


def init_process_group(info: DistInfo, timeout_s: float = 600.0) -> None:
    """Join the job's process group (also for world size 1, so that every
    collective and DCP call takes one code path)."""
    import datetime

    if info.device.startswith("cuda"):
        torch.cuda.set_device(torch.device(info.device))
    if info.world_size == 1 and info.master_port == 0:
        store = dist.HashStore()
        dist.init_process_group(info.backend, store=store, rank=0, world_size=1)
        return
    if info.master_port == 0:
        raise ValueError("MASTER_PORT is not set: the launcher / sbatch script must export it")
    dist.init_process_group(
        backend=info.backend,
        init_method=f"tcp://{info.master_addr}:{info.master_port}",
        rank=info.rank,
        world_size=info.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
        # Binding the device lets NCCL create communicators eagerly.
        device_id=torch.device(info.device) if info.device.startswith("cuda") else None,
    )


def shutdown() -> None:
    if dist.is_initialized():
        # A barrier before teardown avoids "terminate called without an active
        # exception" aborts seen with pipeline schedules (cpu-distributed.md).
        dist.barrier()
        dist.destroy_process_group()
