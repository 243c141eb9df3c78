"""Context parallel (parallelism.cp): each sequence is split over the "cp"
mesh dim and attention runs as ring attention, torch's ``context_parallel``
(torch.distributed.tensor.experimental), used as torchtitan uses it: a
context manager around one micro-batch's forward and backward that shards
the listed buffers along their sequence dim on entry (load-balanced: rank r
keeps chunks r and 2*cp-1-r of 2*cp, so causal work is even) and routes
SDPA to the ring kernels while it is open.

The buffers: the micro-batch's inputs and labels (dim 1) and the model's
RoPE table (dim 0), so every token keeps its own position. The labels are
sharded the same way as the inputs, so each rank's loss is the mean over
its tokens; the cp ranks' gradients are averaged by FSDP, which shards over
dp_shard x cp (train/parallel/mesh.py): together the gradient of the mean
over the whole sequence.

CUDA only: torch 2.13 has ring implementations of the flash, efficient and
cuDNN SDPA kernels; the CPU kernel has no sharding strategy
("Operator aten._scaled_dot_product_flash_attention_for_cpu.default does not
have a sharding strategy registered"; the math kernel mixes DTensor and
Tensor), so the planner refuses cp > 1 on CPU ranks (launcher/plan/cpcheck.py).
"""

from __future__ import annotations

import contextlib

import torch


def cp_shard(cp_mesh, model, inputs: torch.Tensor, targets: torch.Tensor):
    """The context one micro-batch's forward and backward run in: shards
    ``inputs`` and ``targets`` (fresh copies, sharded in place) and the
    model's RoPE table over ``cp_mesh`` (None or one rank: a no-op context).
    Returns (context, inputs, targets); the tensors are this rank's shards
    once the context is open."""
    if cp_mesh is None or cp_mesh.size() == 1:
        return contextlib.nullcontext(), inputs, targets
    from torch.distributed.tensor.experimental import context_parallel

    # Copies: the context resizes its buffers in place, and a micro-batch is
    # a view of the step's batch.
    x, y = inputs.clone(), targets.clone()
    buffers, dims = [x, y], [1, 1]
    rope = getattr(model, "rope", None)
    if isinstance(rope, torch.Tensor):
        buffers.append(rope)  # restored on exit: the next micro-batch shards it again
        dims.append(0)
    ctx = context_parallel(cp_mesh, buffers=buffers, buffer_seq_dims=dims, no_restore_buffers={x, y})
    return ctx, x, y
