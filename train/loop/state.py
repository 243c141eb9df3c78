"""The checkpointed app_state: Stateful wrappers that DCP saves and loads.
Model and optimizer go through get_/set_state_dict so a checkpoint is
layout-free (saved at one parallel layout, loadable at another)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

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


# The optimizer's hyperparameters in DCP's flattened form are 12 keys a
# parameter ("param_groups.<fqn>.lr", ...): on Llama 3 70B's 723 parameters
# 8,676 items that DCP pickles, plans, indexes in .metadata and writes one by
# one (seconds a save on a busy host, a second per rank on resume, about
# half of .metadata's entries). They are saved as one JSON item instead.
GROUPS_KEY = "param_groups"
_GROUP_PREFIX = GROUPS_KEY + "."


def pack_groups(state: dict[str, Any]) -> dict[str, Any]:
    """The flattened optimizer state with its "param_groups.<fqn>.<name>"
    keys as one JSON item: the distinct groups and each parameter's group.
    Unchanged when a value is not plain JSON (a tensor lr, say)."""
    per: dict[str, dict[str, Any]] = {}
    for key, value in state.items():
        if key.startswith(_GROUP_PREFIX):
            if not isinstance(value, (bool, int, float, str, tuple, list, type(None))):
                return state
            fqn, name = key[len(_GROUP_PREFIX) :].rsplit(".", 1)
            per.setdefault(fqn, {})[name] = value
    if not per:
        return state
    groups: list[dict[str, Any]] = []
    params: dict[str, int] = {}
    for fqn, hyper in per.items():
        if hyper not in groups:
            groups.append(hyper)
        params[fqn] = groups.index(hyper)
    out = {k: v for k, v in state.items() if not k.startswith(_GROUP_PREFIX)}
    out[GROUPS_KEY] = json.dumps({"groups": groups, "params": params}, sort_keys=True)
    return out


def unpack_groups(state: dict[str, Any]) -> dict[str, Any]:
    """pack_groups undone (JSON's lists back to tuples: betas)."""
    if not isinstance(state.get(GROUPS_KEY), str):
        return state
    packed = json.loads(state[GROUPS_KEY])
    out = {k: v for k, v in state.items() if k != GROUPS_KEY}
    for fqn, i in packed["params"].items():
        for name, value in packed["groups"][i].items():
            out[f"{_GROUP_PREFIX}{fqn}.{name}"] = tuple(value) if isinstance(value, list) else value
    return out


class OptimState:
    def __init__(self, parts: list[nn.Module], optims: list[torch.optim.Optimizer]) -> None:
        self.parts, self.optims = parts, optims
        # The form state_dict() takes: packed hyperparameters, except while a
        # checkpoint saved in the flattened form is loaded (match_checkpoint).
        self.packed = True

    def match_checkpoint(self, keys: Iterable[str]) -> None:
        """Take the form of the checkpoint about to be loaded (``keys``: its
        keys of this state): DCP loads only the keys the template has."""
        keys = set(keys)
        self.packed = GROUPS_KEY in keys or not any(k.startswith(_GROUP_PREFIX) for k in keys)

    def state_dict(self) -> dict:
        out: dict = {}
        for part, opt in zip(self.parts, self.optims, strict=True):
            out.update(get_optimizer_state_dict(part, opt, options=_OPTS))
        return pack_groups(out) if self.packed else out

    def load_state_dict(self, state: dict) -> None:
        state = unpack_groups(state)
        for part, opt in zip(self.parts, self.optims, strict=True):
            set_optimizer_state_dict(part, opt, state, options=_OPTS)
        self.packed = True


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
