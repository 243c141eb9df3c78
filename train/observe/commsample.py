"""Collective times of a training step: a profiler window of one step every
``every`` steps, its events classified by op (all_reduce, reduce_scatter,
all_gather, send_recv, broadcast, all_to_all, barrier) and summed, read off
the loop thread. :class:`train.observe.metrics.MetricsExporter` exports them as
``meshrun_collective_seconds{op}`` / ``meshrun_collective_calls{op}``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections import defaultdict, deque
from collections.abc import Iterator
from typing import Any

COLLECTIVE_OPS = (
    "all_reduce",
    "reduce_scatter",
    "all_gather",
    "send_recv",
    "broadcast",
    "all_to_all",
    "barrier",
)


def classify_collective(name: str) -> str | None:
    """Map a profiler event name to a collective op, None if it is not one.

    gloo work runs on its own threads as ``gloo:all_reduce`` events; NCCL's
    CUDA kernels are ``ncclDevKernel_AllReduce_Sum_f32_RING_LL`` (or
    ``ncclKernel_...`` on older NCCL). The CPU-side ``nccl:*`` and ``c10d::*``
    events only enqueue work, so they are not counted.
    """
    low = name.lower()
    if low.startswith("gloo:"):
        op = low[5:]
    elif low.startswith("nccldevkernel_") or low.startswith("ncclkernel_"):
        op = low.split("_", 1)[1]
    else:
        return None
    op = op.replace("_", "")
    for key, canon in (
        ("allreduce", "all_reduce"),
        ("reducescatter", "reduce_scatter"),
        ("allgather", "all_gather"),
        ("alltoall", "all_to_all"),
        ("sendrecv", "send_recv"),
        ("send", "send_recv"),
        ("recv", "send_recv"),
        ("broadcast", "broadcast"),
        ("barrier", "barrier"),
        ("reduce", "all_reduce"),
    ):
        if op.startswith(key):
            return canon
    return None


def summarize_collectives(events: list[tuple[str, float]]) -> dict[str, tuple[float, int]]:
    """(event name, duration in us) pairs -> {op: (seconds, calls)}."""
    out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for name, dur_us in events:
        op = classify_collective(name)
        if op is not None:
            out[op][0] += dur_us / 1e6
            out[op][1] += 1
    return {op: (s, int(n)) for op, (s, n) in out.items()}


@contextlib.contextmanager
def _quiet_native_stderr() -> Iterator[None]:
    """Kineto prints 'USDT: profiler_start/stop' from C++ on every window;
    keep it out of the user's progress output (fd-level, Python can't)."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


class CollectiveSampler:
    """Time in collectives, measured with the PyTorch profiler over ONE
    training step, once every ``every`` metric updates.

    Why the profiler: it sees every path a collective takes (c10d calls from
    FSDP2, DTensor's functional collectives for TP, pipeline send/recv) and
    records the work where it runs: gloo's worker threads on CPU, the NCCL
    kernels on the GPU (CUPTI), so the figure is time spent in the
    collective, not time to enqueue it.

    Why one step, and why the parse runs off the loop: a window spanning a
    whole log interval, parsed with ``prof.events()`` on the loop thread,
    blocked the loop for 50-110 s on a loaded machine, long enough that a
    time-limit signal was acted on after Slurm's kill. Now the loop only
    starts and stops the profiler around one step (``step_begin`` /
    ``step_end``); the raw Kineto events (no FunctionEvent tree) are read by
    a daemon thread, at most ``max_events`` of them, and the summary is
    picked up by a later ``on_update``. A new window is not opened while the
    previous one is still being read, so at most one trace exists.
    """

    # Far more than one step of a real model records (FSDP2 over a few
    # dozen layers: ~1e4-1e5 events); a cap, not a target.
    MAX_EVENTS = 200_000

    def __init__(self, every: int, cuda: bool, max_events: int = MAX_EVENTS) -> None:
        self.every = every
        self.cuda = cuda
        self.max_events = max_events
        self._prof: Any = None
        self._armed = False
        self._updates = 0
        self._window_step: int | None = None
        self._reader: threading.Thread | None = None
        self._pending: dict[str, tuple[float, int]] | None = None
        self._lock = threading.Lock()
        self.last: dict[str, tuple[float, int]] | None = None
        # For tests and logs: the steps each window covered, and how many
        # raw events the last read examined (never more than max_events).
        self.windows: deque[tuple[int, int]] = deque(maxlen=16)
        self.last_events_read = 0
        self.last_truncated = False

    def on_update(self, step: int) -> dict[str, tuple[float, int]] | None:
        """Call once per metrics ``update``; arms a one-step window every
        ``every`` updates and returns a summary read since the last call."""
        self._updates += 1
        # Skip the first update (warm-up, compilation); then every `every`.
        if self.every > 0 and self._updates >= 2 and (self._updates - 2) % self.every == 0:
            self._armed = True
        with self._lock:
            result, self._pending = self._pending, None
        if result is not None:
            self.last = result
        return result

    def step_begin(self, step: int) -> None:
        """Call before each training step: opens the window when armed."""
        if not self._armed or self._prof is not None:
            return
        if self._reader is not None and self._reader.is_alive():
            return  # the previous trace is still being read: wait a step
        import torch.autograd.profiler as autograd_profiler
        from torch.profiler import ProfilerActivity, profile

        self._armed = False
        if autograd_profiler._is_profiler_enabled:  # someone else is profiling: stay out
            return
        activities = [ProfilerActivity.CPU]
        if self.cuda:
            activities.append(ProfilerActivity.CUDA)
        self._prof = profile(activities=activities, record_shapes=False, with_stack=False)
        with _quiet_native_stderr():
            self._prof.__enter__()
        self._window_step = step

    def step_end(self, step: int) -> None:
        """Call after each training step: closes an open window (so it never
        covers more than this one step) and hands its trace to a reader."""
        if self._prof is None:
            return
        prof, self._prof = self._prof, None
        with _quiet_native_stderr():
            prof.__exit__(None, None, None)  # stops recording; parses nothing
        start = self._window_step if self._window_step is not None else step
        self.windows.append((start, step))
        results = getattr(prof.profiler, "kineto_results", None)
        if results is None:
            return
        self._reader = threading.Thread(
            target=self._read, args=(results, step - start + 1), name="meshrun-comm-sample", daemon=True
        )
        self._reader.start()

    def _read(self, results: Any, steps: int) -> None:
        events: list[tuple[str, float]] = []
        seen = 0
        for e in results.events():
            if seen >= self.max_events:
                break
            seen += 1
            name = e.name()
            if name.startswith("gloo:") or (self.cuda and name.startswith("nccl") and "Kernel" in name):
                events.append((name, e.duration_ns() / 1e3))
        truncated = seen >= self.max_events
        totals = summarize_collectives(events)
        summary = {op: (s / steps, round(n / steps)) for op, (s, n) in totals.items()}
        with self._lock:
            self.last_events_read, self.last_truncated = seen, truncated
            self._pending = summary

    def wait_read(self, timeout_s: float | None = None) -> None:
        """Wait for the trace reader (tests; ``close``)."""
        if self._reader is not None:
            self._reader.join(timeout_s)

    def close(self) -> None:
        if self._prof is not None:
            with _quiet_native_stderr():
                self._prof.__exit__(None, None, None)
            self._prof = None
