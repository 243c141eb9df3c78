"""Host synchronisations of the training loop: counted, or refused, per step.

A training step that reads a device value on the host (``.item()``,
``.tolist()``, ``.cpu()``, ``bool(t)``, ``float(t)``, ``.numpy()``) or waits
on the host for a collective that has not finished makes the CPU stop
queueing work until the GPU catches up: the next step's kernels start late.
The loop reads device values on logging steps only (train/loop/trainer.py) and the
stop vote a step after it was started (train/loop/signals.py).

``train.host_sync_check`` turns on :class:`SyncWatch` around each step:
``count`` logs ``host_syncs`` (the reads the step made) in each logged step's
metrics; ``raise`` also fails the run at the first read on a step that logs
nothing (the test of this rule, tests/unit/test_host_sync.py). ``off`` (the
default) installs nothing: no overhead.

The optimizer's step counters are CPU tensors by design (AdamW, not
``capturable``): reads of them inside torch.optim are not device syncs and
are not counted.
"""

from __future__ import annotations

import os
import traceback
from typing import Any

from torch.overrides import TorchFunctionMode

# Tensor methods that copy a value to the host and so wait for the device.
READS = frozenset({"item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__"})
# Frames under these torch directories read CPU-resident state by design.
_CPU_STATE_DIRS = (os.sep + os.path.join("torch", "optim") + os.sep,)


class HostSyncError(RuntimeError):
    """A non-logging step read a device value on the host."""


def _from_cpu_state() -> bool:
    """True when the read comes from torch.optim (its CPU step counters)."""
    for frame in traceback.extract_stack(limit=8)[:-3]:
        if any(d in frame.filename for d in _CPU_STATE_DIRS):
            return True
    return False


class SyncWatch(TorchFunctionMode):
    """Counts host reads of tensors while active; with ``strict`` a read
    raises :class:`HostSyncError` naming the call (the step's reads are
    allowed on logging steps: :meth:`allow`)."""

    def __init__(self, strict: bool) -> None:
        super().__init__()
        self.strict = strict
        self.count = 0
        self.allowed = False
        self.where: list[str] = []

    def allow(self, allowed: bool) -> None:
        self.allowed = allowed

    def note(self, what: str) -> None:
        """One host sync that is not a tensor method (a collective waited on
        before it finished)."""
        self.count += 1
        self.where.append(what)
        if self.strict and not self.allowed:
            raise HostSyncError(f"host sync on a non-logging step: {what}")

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in READS and not _from_cpu_state():
            caller = traceback.extract_stack(limit=3)[0]
            self.note(f"Tensor.{name}() at {caller.filename}:{caller.lineno}")
        return func(*args, **(kwargs or {}))


_active: SyncWatch | None = None


def unwatched() -> Any:
    """A context in which tensor reads are not seen (ones that are not
    device syncs, or that the caller counted with :func:`note`)."""
    import torch

    return torch._C.DisableTorchFunction()


def watch(mode: str) -> SyncWatch | None:
    """The process's watch for ``train.host_sync_check`` (None when off)."""
    global _active
    if mode != "off" and _active is None:
        _active = SyncWatch(strict=mode == "raise")
    return _active


def note(what: str) -> None:
    """Record a host wait outside tensor methods (no-op without a watch)."""
    if _active is not None:
        _active.note(what)


class during:
    """``with during(watch, allowed)``: the watch active over one step
    (nothing when ``watch`` is None); reads allowed on logging steps."""

    def __init__(self, w: SyncWatch | None, allowed: bool) -> None:
        self.w, self.allowed = w, allowed

    def __enter__(self) -> None:
        if self.w is not None:
            self.w.allow(self.allowed)
            self.w.__enter__()

    def __exit__(self, *exc: object) -> None:
        if self.w is not None:
            self.w.__exit__(*exc)
            self.w.allow(True)
