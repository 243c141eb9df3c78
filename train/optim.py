"""AdamW, warmup + cosine LR, and gradient clipping across DTensors and
pipeline stages."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

from launcher.config.schema import TrainConfig


def build_optimizers(
    parts: list[nn.Module], t: TrainConfig, foreach: bool | None = None
) -> list[torch.optim.Optimizer]:
    """One AdamW per model part (pipeline stage) so optimizer state dicts stay
    keyed by the original parameter names. No weight decay on norms."""
    out = []
    for part in parts:
        decay, no_decay = [], []
        for name, p in part.named_parameters():
            (no_decay if name.endswith("norm.weight") else decay).append(p)
        groups = [
            {"params": decay, "weight_decay": t.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        out.append(torch.optim.AdamW(groups, lr=t.lr, betas=(0.9, 0.95), eps=1e-8, foreach=foreach))
    return out


def lr_factor(step: int, t: TrainConfig) -> float:
    """LR multiplier for optimizer step ``step`` (0-based): linear warmup to 1,
    then cosine down to min_lr_ratio at the last step."""
    if step < t.warmup_steps:
        return (step + 1) / (t.warmup_steps + 1)
    span = max(1, t.steps - t.warmup_steps)
    progress = min(1.0, (step - t.warmup_steps) / span)
    return t.min_lr_ratio + (1 - t.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_schedulers(optims: list[torch.optim.Optimizer], t: TrainConfig) -> list:
    return [torch.optim.lr_scheduler.LambdaLR(o, lambda s: lr_factor(s, t)) for o in optims]


@torch.no_grad()
def clip_grad_norm(params: list[torch.Tensor], max_norm: float, pp_group=None) -> torch.Tensor:
    """Global L2 grad norm over every rank's shards (a DTensor norm reduces
    over dp/tp; an all-reduce adds the pipeline stages), then clip when
    max_norm > 0. Returns the norm before clipping, as a plain tensor."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, 2.0, error_if_nonfinite=False, foreach=True)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    if pp_group is not None and dist.get_world_size(pp_group) > 1:
        sq = total.float() ** 2
        dist.all_reduce(sq, group=pp_group)
        total = sq.sqrt()
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total, foreach=True)
    return total
