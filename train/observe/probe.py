"""Each rank's solo probe for the straggler watch (launcher/selfheal/straggler.py).

A synchronous step takes the same wall time on every rank (the fast ones
wait in the collectives), so step times cannot show a slow rank. Every
``launcher.straggler_probe_every_steps`` steps each rank times a fixed
matmul loop on its own device, with no collective, and puts the seconds in
its heartbeat (train/observe/heartbeat.py ``probe``). Why a probe and not
the compute between collectives: under FSDP the forward and backward
interleave with all-gathers and reduce-scatters, so no clean per-rank
compute span exists; a fixed loop measures the same work on every rank
(a throttled GPU, a CPU-starved or stopped process), and costs a few ms
(GPU: 8 x 4096^3 bf16 matmuls, 1.1 TFLOP, some 1.5 ms at an H100's dense
bf16 peak, an estimate not measured here; CPU: 8 x 384^3 fp32, some 10 ms).
"""

from __future__ import annotations

import time
from typing import Any

from train.observe import heartbeat

ITERS = 8
SIZE = {"cuda": 4096, "cpu": 384}


class SoloProbe:
    """Times the loop at every ``every``-th step (0: never)."""

    def __init__(self, every: int, device: Any) -> None:
        import torch

        self.every = every
        self.device = torch.device(device)
        n = SIZE["cuda" if self.device.type == "cuda" else "cpu"]
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.a = torch.randn(n, n, device=self.device, dtype=dtype) if every else None
        self.saved_at = -1  # the step of the newest save

    def _sync(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def maybe(self, step: int) -> None:
        """Probe at ``step`` when due; tagged ``after_save`` when a save was at
        the step before (its staging and the checkpoint worker compete)."""
        if not self.every or self.a is None or step % self.every:
            return
        b = self.a @ self.a  # untimed: the first call's allocations
        self._sync()
        t0 = time.perf_counter()
        for _ in range(ITERS):
            b = self.a @ b
            b = b / b.abs().amax().clamp(min=1)  # bounded values, same work every time
        self._sync()
        heartbeat.probe(step, time.perf_counter() - t0, after_save=self.saved_at >= step - 1)
