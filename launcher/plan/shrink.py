"""A smaller layout for a training run that lost nodes (the batch-level
supervisor, launcher/selfheal/supervisor.py, when no spare node is left).

Only the data-parallel degree shrinks: tensor and pipeline degrees, ranks
per node, the micro batch and the global batch stay, and the gradient
accumulation (pipeline: the microbatches per step) grows so that every step
still sees the same global batch. The checkpoint reshards to the new layout
at resume (DCP), and the loaders' positions are global (same samples).
A layout is refused, with the reason, when the ranks do not divide by
tp x pp, when the global batch does not divide by micro batch x new dp,
when an HSDP shard group would be cut, or when the memory estimate at the
new sharding does not fit.
"""

from __future__ import annotations

import dataclasses

from launcher.config.plandata import Plan
from launcher.config.schema import ModelConfig
from launcher.plan.memory import estimate_memory


def shrink_plan(plan: Plan, model: ModelConfig, nodes: int) -> tuple[Plan | None, str]:
    """The plan on the most nodes (at most ``nodes``, fewer than the plan's)
    that keeps the run's training the same, or (None, why none does)."""
    whys = []
    for m in range(min(nodes, plan.nodes - 1), 0, -1):
        shrunk, why = plan_on_nodes(plan, model, m)
        if shrunk is not None:
            return shrunk, ""
        whys.append(f"{m} node(s): {why}")
    if not whys:
        return None, f"{nodes} healthy node(s) of the {plan.nodes} planned: nothing to run on"
    return None, "; ".join(whys)


def plan_on_nodes(plan: Plan, model: ModelConfig, nodes: int) -> tuple[Plan | None, str]:
    """``plan`` on ``nodes`` nodes at a smaller data-parallel degree, or (None, why not)."""
    world = nodes * plan.ranks_per_node
    replica = plan.tp * plan.pp
    if world % replica:
        return None, f"{world} ranks are not a multiple of tp x pp = {plan.tp} x {plan.pp}"
    dp = world // replica
    if plan.dp_replicate == 1:
        dp_replicate, dp_shard = 1, dp
    elif dp % plan.dp_shard == 0:  # HSDP: fewer replicas, the shard groups stay
        dp_replicate, dp_shard = dp // plan.dp_shard, plan.dp_shard
    else:
        return None, f"data-parallel degree {dp} is not a multiple of the HSDP shard group {plan.dp_shard}"
    gbs, mbs = plan.global_batch_size, plan.micro_batch_size
    if gbs % (mbs * dp):
        return None, (
            f"global_batch_size={gbs} is not divisible by micro_batch_size={mbs} x data-parallel degree {dp}"
        )
    per_step = gbs // (mbs * dp)  # micro batches per rank and step
    accum, n_mb = (1, per_step) if plan.pp > 1 else (per_step, plan.pp_microbatches)
    mem = estimate_memory(
        model,
        tp=plan.tp,
        pp=plan.pp,
        dp_shard=dp_shard,
        stages_per_rank=plan.stages_per_rank,
        micro_batch_size=mbs,
        n_microbatches=n_mb,
        pp_schedule=plan.pp_schedule,
        activation_checkpointing=plan.activation_checkpointing,
        precision=plan.precision,
        capacity_gb=plan.memory.capacity_gb,
        overhead_gb=plan.memory.overhead_gb,
    )
    if not mem.fits:
        name, gb = mem.biggest()
        return None, (
            f"{mem.total_gb:.1f} GB per rank at dp_shard={dp_shard} exceeds {mem.capacity_gb:.1f} GB "
            f"(largest term: {name} {gb:.1f} GB)"
        )
    what = (
        f"shrunk from {plan.nodes} to {nodes} node(s): data-parallel degree {plan.dp} -> {dp}, "
        + (
            f"pipeline microbatches {plan.pp_microbatches} -> {n_mb}"
            if plan.pp > 1
            else f"gradient accumulation {plan.grad_accum_steps} -> {accum} step(s)"
        )
        + f", global batch {gbs} kept"
    )
    shrunk = dataclasses.replace(
        plan,
        world_size=world,
        nodes=nodes,
        dp_replicate=dp_replicate,
        dp_shard=dp_shard,
        grad_accum_steps=accum,
        pp_microbatches=n_mb,
        mode="fsdp" if plan.mode == "hsdp" and dp_replicate == 1 else plan.mode,
        memory=mem,
        reasons=[*plan.reasons, what],
    )
    return shrunk, ""


def shrink_summary(old: Plan, new: Plan) -> dict[str, list[int]]:
    """[old, new] of what a shrink changes (a faults.jsonl record's ``shrink``)."""
    return {
        "nodes": [old.nodes, new.nodes],
        "world_size": [old.world_size, new.world_size],
        "dp": [old.dp, new.dp],
        "dp_replicate": [old.dp_replicate, new.dp_replicate],
        "dp_shard": [old.dp_shard, new.dp_shard],
        "grad_accum_steps": [old.grad_accum_steps, new.grad_accum_steps],
        "pp_microbatches": [old.pp_microbatches, new.pp_microbatches],
        "global_batch_size": [old.global_batch_size, new.global_batch_size],
    }
