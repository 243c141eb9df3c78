"""What a run asks of each node (render.py's ``sbatch_parameters``): tasks,
CPUs and memory. An exclusive run asks the whole node; a shared one
(``launcher.exclusive=false``) asks in proportion to the GPUs it asks of the
node's (``cluster.node_gpus``), CPU work (no GPUs) one CPU per task and
memory in proportion to its CPUs, so other jobs can start beside it;
``launcher.cpus_per_task`` / ``launcher.mem_gb`` say it outright."""

from __future__ import annotations

import math

from launcher.config.scriptjob import tasks_per_node
from launcher.config.spec import RunSpec

MEM_HEADROOM = 0.95  # leave 5% of node memory to the OS and Slurm


def task_count(spec: RunSpec) -> int:
    """Slurm tasks per node: one per rank (job.launch=torchrun: one per node)."""
    return tasks_per_node(spec.cfg.job.kind, spec.cfg.job.launch, spec.plan.ranks_per_node)


def node_share(spec: RunSpec) -> float:
    """The part of a node the run asks: all of it when exclusive, else its
    GPUs' share of the node's (cluster.node_gpus), or for CPU work its CPUs'."""
    c = spec.cfg.cluster
    if spec.cfg.launcher.exclusive:
        return 1.0
    if c.gpus_per_node:
        return min(1.0, c.gpus_per_node / (c.node_gpus or c.gpus_per_node))
    return min(1.0, task_count(spec) * cpus_per_task(spec) / c.cpus_per_node)


def node_mem_gb(spec: RunSpec) -> int:
    """Memory asked per node: launcher.mem_gb, or the node's minus headroom times the run's share."""
    share = spec.cfg.cluster.mem_per_node_gb * MEM_HEADROOM * node_share(spec)
    return spec.cfg.launcher.mem_gb or max(1, int(math.floor(share)))


def cpus_per_task(spec: RunSpec) -> int:
    """launcher.cpus_per_task, else the node's (or the GPUs' share of its) CPUs per task; CPU work shared: 1."""
    c, launcher = spec.cfg.cluster, spec.cfg.launcher
    if launcher.cpus_per_task or (not launcher.exclusive and not c.gpus_per_node):
        return launcher.cpus_per_task or 1
    return max(1, math.floor(c.cpus_per_node * node_share(spec)) // task_count(spec))
