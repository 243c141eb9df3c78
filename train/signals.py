"""Preemption and time-limit signal: the handler only sets a flag.

Slurm sends USR2 ``launcher.signal_lead_s`` seconds before the time limit and
at preemption (``--signal=USR2@<lead>``; USR1 belongs to NCCL). Doing real
work inside a signal handler (collectives, checkpoint I/O) breaks runs, so the
handler records the request and the training loop, at its next step boundary,
saves a checkpoint, writes ``result.json`` with status ``preempted`` and exits
with :data:`REQUEUE_EXIT_CODE`; the batch script (launcher/render.py) then
requeues the job, outside any container.

All ranks must agree to stop at the same step: a rank whose flag is set while
another's is not would deadlock the next collective. :meth:`PreemptFlag.agreed`
takes the max over ranks when a process group is up.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType

# Also launcher.render.REQUEUE_EXIT_CODE (checked by tests/test_slurm_render.py).
REQUEUE_EXIT_CODE = 75  # EX_TEMPFAIL: "try again later"
# USR2 only: SIGTERM comes from scancel too, and a cancelled job must stop,
# not checkpoint and ask to be requeued.
SIGNALS = (signal.SIGUSR2,)


class PreemptFlag:
    """Set by USR2; polled by the training loop."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signum: int | None = None

    def set(self, signum: int = signal.SIGUSR2) -> None:
        if self.signum is None:
            self.signum = signum
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def agreed(self) -> bool:
        """True on every rank once any rank has been signalled (a collective:
        call it on all ranks at the same step, or not at all)."""
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return self.is_set()
        backend = dist.get_backend()
        device = "cuda" if backend == "nccl" else "cpu"
        t = torch.tensor([1 if self.is_set() else 0], dtype=torch.int32, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    @property
    def reason(self) -> str:
        if self.signum is None:
            return ""
        return signal.Signals(self.signum).name


_flag: PreemptFlag | None = None


def _handler(signum: int, frame: FrameType | None) -> None:
    # Only set the flag: no I/O, no locks, no collectives here.
    assert _flag is not None
    _flag.set(signum)


def install(signals: tuple[signal.Signals, ...] = SIGNALS) -> PreemptFlag:
    """Install the handler (main thread only) and return the process's flag."""
    global _flag
    if _flag is None:
        _flag = PreemptFlag()
    for sig in signals:
        signal.signal(sig, _handler)
    return _flag


def restart_count() -> int:
    """How many times Slurm has requeued this job (0 on the first run)."""
    return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)


def _main() -> int:
    """``python -m train.signals <run_dir>``: install the flag before anything
    heavy is imported, then run ``python -m train <run_dir>`` in this process.
    A USR2 that arrives while torch is still loading (short limits, a busy
    node) is then recorded instead of killing the task."""
    import runpy
    import sys

    from train import signals  # the module object the trainer will import

    signals.install()
    sys.argv = ["train", *sys.argv[1:]]
    code = 0
    try:
        runpy.run_module("train", run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    # Training is over: a late USR2 (time limit near) must not kill the task
    # while the interpreter shuts down, when Python restores SIG_DFL for its
    # own handlers but keeps SIG_IGN.
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    return code


if __name__ == "__main__":
    raise SystemExit(_main())
