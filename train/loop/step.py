"""One optimizer step: forward/backward over micro-batches (or through the
pipeline schedule), gradient clipping, AdamW, LR schedule."""

from __future__ import annotations

import torch
import torch.distributed as dist

from train.loop.build import Trainer, loss_fn
from train.loop.optim import clip_grad_norm
from train.parallel.cp import cp_shard


def forward_backward(t: Trainer, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Returns this rank's mean loss (0 on pipeline ranks without the last
    stage). Gradients equal those of one mean loss over the whole batch."""
    if t.schedule is not None:
        losses: list[torch.Tensor] = []
        kw = {"target": targets, "losses": losses} if t.has_last_stage else {}
        if t.has_first_stage:
            t.schedule.step(inputs, **kw)
        else:
            t.schedule.step(**kw)
        if not t.has_last_stage:
            return torch.zeros((), device=t.device)
        return torch.stack([x.detach().float() for x in losses]).mean()
    accum = t.spec.plan.grad_accum_steps
    total = torch.zeros((), device=t.device)
    cp_mesh = t.mesh["cp"] if t.dims.cp > 1 else None
    for x, y in zip(inputs.chunk(accum), targets.chunk(accum), strict=True):
        # Context parallel: this rank's sequence shards (train/parallel/cp.py).
        ctx, x, y = cp_shard(cp_mesh, t.parts[0], x, y)
        with ctx:
            loss = loss_fn(t.parts[0](x), y) / accum
            loss.backward()
        total += loss.detach()
    return total


def train_step(t: Trainer, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(global mean loss, global grad norm) after one optimizer step, as
    0-d fp32 tensors on the device: nothing here waits for the device, so the
    host queues the next step while this one runs. The loop reads them on
    logging steps only (train/loop/trainer.py)."""
    for opt in t.optims:
        opt.zero_grad(set_to_none=True)
    local_loss = forward_backward(t, inputs, targets)
    pp_group = t.mesh["pp"].get_group() if t.dims.pp > 1 else None
    grad_norm = clip_grad_norm(t.params, t.spec.cfg.train.grad_clip, pp_group)
    for opt in t.optims:
        opt.step()
    if t.float8_precompute:
        from train.parallel.float8 import precompute_scales

        precompute_scales(t.parts)
    for s in t.schedulers:
        s.step()
    # Loss averaged over dp ranks; only last-stage ranks hold one, the tp
    # peers of a rank hold the same value and cp peers the means of equal
    # shares of the sequence: one all-reduce over the world (queued on the
    # device under NCCL; the host does not wait for it).
    loss = local_loss.detach().float().clone()
    dist.all_reduce(loss)
    loss = loss / (t.dims.dp * t.dims.tp * t.dims.cp)
    return loss, grad_norm.detach().float()


def read_scalars(*values: torch.Tensor) -> list[float]:
    """Device scalars to Python floats in one host sync (a logging step)."""
    return torch.stack([v.reshape(()) for v in values]).tolist()
