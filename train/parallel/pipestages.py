"""Pipeline parallel: split the layers into pp x stages_per_rank stages,
place them on pp ranks (looped for GPipe/1F1B/Interleaved1F1B, V-shaped for
the zero-bubble ZBV schedule), and build the schedule."""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch

from train.models.llama import Llama

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "zbv")


def stage_ids_for_rank(pp_rank: int, pp: int, stages_per_rank: int, schedule: str) -> list[int]:
    if schedule == "zbv":
        assert stages_per_rank == 2, stages_per_rank
        return [pp_rank, 2 * pp - 1 - pp_rank]  # V: rank 0 holds the first and the last stage
    return [pp_rank + k * pp for k in range(stages_per_rank)]


def layer_ranges(n_layers: int, n_stages: int) -> list[range]:
    """Contiguous, as even as possible; earlier stages get the extra layers
    except that the first (embedding) and last (output) stages are filled
    last."""
    base, extra = divmod(n_layers, n_stages)
    sizes = [base] * n_stages
    # Middle stages take the remainder first: the ends carry embedding/output.
    order = list(range(1, n_stages - 1)) + [0, n_stages - 1] if n_stages > 2 else list(range(n_stages))
    for i in order[:extra]:
        sizes[i] += 1
    out, start = [], 0
    for s in sizes:
        out.append(range(start, start + s))
        start += s
    return out


def split_stage(model: Llama, stage: int, n_stages: int) -> Llama:
    """A meta-device copy of ``model`` holding only this stage's layers."""
    part = copy.deepcopy(model)
    keep = {str(i) for i in layer_ranges(len(model.layers), n_stages)[stage]}
    for key in list(part.layers.keys()):
        if key not in keep:
            del part.layers[key]
    if stage != 0:
        part.tok_embeddings = None
    if stage != n_stages - 1:
        part.norm = None
        part.output = None
    return part


def build_schedule(
    stage_modules: list[tuple[int, torch.nn.Module]],
    n_stages: int,
    schedule: str,
    n_microbatches: int,
    device: torch.device,
    pp_group,
    loss_fn: Callable,
):
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
        ScheduleZBVZeroBubble,
    )

    if schedule not in SCHEDULES:
        raise ValueError(
            f"parallelism.pp_schedule={schedule!r} is invalid: choose one of {', '.join(SCHEDULES)}"
        )
    stages = [PipelineStage(mod, idx, n_stages, device, group=pp_group) for idx, mod in stage_modules]
    # scale_grads=True (default): gradients are averaged over microbatches, so
    # a step equals one full-batch step with a mean loss.
    if schedule == "gpipe":
        return ScheduleGPipe(stages[0], n_microbatches, loss_fn=loss_fn)
    if schedule == "1f1b":
        return Schedule1F1B(stages[0], n_microbatches, loss_fn=loss_fn)
    if schedule == "interleaved_1f1b":
        return ScheduleInterleaved1F1B(stages, n_microbatches, loss_fn=loss_fn)
    return ScheduleZBVZeroBubble(stages, n_microbatches, loss_fn=loss_fn)
