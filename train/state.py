"""The checkpointed app_state: Stateful wrappers that DCP saves and loads.
Model and optimizer go through get_/set_state_dict so a checkpoint is
layout-free (saved at one parallel layout, loadable at another)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

# Flattened optimizer keys ("state.<fqn>.exp_avg") merge cleanly across
# pipeline stages, whose parameter names are disjoint.
_OPTS = StateDictOptions(flatten_optimizer_state_dict=True)


class ModelState:
    def __init__(self, parts: list[nn.Module]) -> None:
        self.parts = parts

    def state_dict(self) -> dict:
        return {k: v for part in self.parts for k, v in get_model_state_dict(part, options=_OPTS).items()}

    def load_state_dict(self, state: dict) -> None:
        for part in self.parts:
            set_model_state_dict(part, state, options=StateDictOptions(strict=False))


class OptimState:
    def __init__(self, parts: list[nn.Module], optims: list[torch.optim.Optimizer]) -> None:
        self.parts, self.optims = parts, optims

    def state_dict(self) -> dict:
        out: dict = {}
        for part, opt in zip(self.parts, self.optims, strict=True):
            out.update(get_optimizer_state_dict(part, opt, options=_OPTS))
        return out

    def load_state_dict(self, state: dict) -> None:
        for part, opt in zip(self.parts, self.optims, strict=True):
            set_optimizer_state_dict(part, opt, state, options=_OPTS)


class SchedulerState:
    def __init__(self, schedulers: list) -> None:
        self.schedulers = schedulers

    def state_dict(self) -> dict:
        # All stages step together: one scheduler's position describes them all.
        return {"last_epoch": self.schedulers[0].last_epoch}

    def load_state_dict(self, state: dict) -> None:
        for s in self.schedulers:
            s.last_epoch = int(state["last_epoch"])
            for group, base, fn in zip(s.optimizer.param_groups, s.base_lrs, s.lr_lambdas, strict=True):
                group["lr"] = base * fn(s.last_epoch)
            s._last_lr = [g["lr"] for g in s.optimizer.param_groups]


class LoaderState:
    def __init__(self, loader) -> None:
        self.loader = loader

    def state_dict(self) -> dict:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.loader.load_state_dict(state)


class RNGState:
    """Init and synthetic data are seed functions, so the RNG only matters
    for user code (dropout, augmentations); every rank starts from the same
    seed, so one saved state (DCP keeps rank 0's copy) restores them all."""

    def state_dict(self) -> dict:
        out = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            out["cuda"] = torch.cuda.get_rng_state()
        return out

    def load_state_dict(self, state: dict) -> None:
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state(state["cuda"])


@dataclass
class Progress:
    step: int = 0
    tokens: int = 0
    restarts: int = 0
    extra: dict = field(default_factory=dict)

    def state_dict(self) -> dict:
        return {"step": self.step, "tokens": self.tokens, "restarts": self.restarts}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])
        self.tokens = int(state["tokens"])
        self.restarts = int(state["restarts"])


def build_app_state(parts, optims, schedulers, loader, progress: Progress) -> dict:
    return {
        "model": ModelState(parts),
        "optim": OptimState(parts, optims),
        "lr_scheduler": SchedulerState(schedulers),
        "data": LoaderState(loader),
        "rng": RNGState(),
        "progress": progress,
    }
