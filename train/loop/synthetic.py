"""data=synthetic: learnable token sequences, a pure function of (seed, step),
sharded by data-parallel rank. Every layout of the same run sees the same
global batch at each step, so runs compare exactly against one process."""

from __future__ import annotations

import time

import torch

from launcher.config.spec import RunSpec
from train.parallel.dist import DistInfo

MAX_STRIDE = 8


class SyntheticLoader:
    """Each sequence counts from a random start with a random stride (mod
    vocab): after two tokens the rest is predictable, so loss falls fast."""

    def __init__(self, spec: RunSpec, info: DistInfo) -> None:
        self.seed = spec.cfg.train.seed
        self.vocab = spec.cfg.model.vocab_size
        self.seq_len = spec.cfg.model.seq_len
        gbs = spec.plan.global_batch_size
        assert gbs % info.dp_size == 0, (gbs, info.dp_size)
        self.local = gbs // info.dp_size
        self.lo = info.dp_rank * self.local
        self.gbs = gbs
        self.device = torch.device(info.device)
        self.step = 0
        self.last_wait_s = 0.0

    def batch_at(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        start = torch.randint(0, self.vocab, (self.gbs, 1), generator=gen)
        stride = torch.randint(1, MAX_STRIDE, (self.gbs, 1), generator=gen)
        seq = (start + stride * torch.arange(self.seq_len + 1)) % self.vocab
        mine = seq[self.lo : self.lo + self.local]
        return mine[:, :-1].to(self.device), mine[:, 1:].to(self.device)

    def __iter__(self):
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        t0 = time.perf_counter()
        out = self.batch_at(self.step)
        self.step += 1
        self.last_wait_s = time.perf_counter() - t0
        return out

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])
