"""The trainer's side of its checkpoint worker (:mod:`train.checkpoint.worker`):
spawns the process, sends it work, reads its replies.

A rebuild after an in-process recovery defers the spawn: the worker's start
(a Python that imports torch) beside the first resumed step made that step
take 2.4 s instead of 0.15-0.3 s on a 2-core host, even at SCHED_IDLE
(the local in-process SIGKILL case, every rank). The trainer starts it after
that step (:meth:`WorkerHandle.start`), or its first message does.
"""

from __future__ import annotations

import atexit
import contextlib
import signal
import sys
import threading
import time
import types
from typing import Any

from train.checkpoint.worker import STOP_SIGNALS, WorkerSetup, idle_threads, serve


class WorkerHandle:
    """Trainer side: spawns the worker and talks to it. Only the training
    thread reads replies; sends are serialized by a lock (the staging thread
    sends the save it staged)."""

    def __init__(self, setup: WorkerSetup, deferred: bool = False) -> None:
        """``deferred`` (a rebuild's): no spawn until :meth:`start` or the
        first message, then SCHED_IDLE from the spawn, not from serve()."""
        import multiprocessing as mp

        import torch.multiprocessing  # noqa: F401 (registers tensor sharing for the pipe)

        ctx = mp.get_context("spawn")
        self._lag = ctx.Value("d", -1.0, lock=False)
        self._beat = ctx.Value("d", time.monotonic(), lock=False)
        self._conn, self._child = ctx.Pipe()
        self.proc = ctx.Process(
            target=serve, args=(self._child, setup, self._lag, self._beat), name="ckpt-worker", daemon=True
        )
        self._deferred = deferred
        self._start_lock = threading.Lock()
        self.started = False
        self._lock = threading.Lock()
        self._inbox: list[tuple[Any, ...]] = []
        if not deferred:
            self.start()

    def start(self) -> None:
        """Spawn the worker (once; any thread)."""
        with self._start_lock:
            if self.started:
                return
            # Stop signals blocked at its start (a mask survives fork and exec; serve()
            # ignores them, then unblocks): a SIGTERM to the step while it imports must
            # not kill it. Only this thread's mask changes (gloo's and the store's
            # threads still take the trainer's). The resource tracker starts first,
            # outside the block (its start unblocks SIGINT and SIGTERM in the calling
            # thread). The stub __main__: spawn would re-import the entry point.
            from multiprocessing import resource_tracker

            resource_tracker.ensure_running()
            main = sys.modules["__main__"]
            old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            sys.modules["__main__"] = types.ModuleType("__main__")
            try:
                self.proc.start()
            finally:
                sys.modules["__main__"] = main
                signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
            # Idle from serve() (importing torch idle beside busy ranks, 10-12 s to
            # its first commit, 5-6 s else: an early preemption save must make its
            # grace), but in a rebuild, whose imports stall the survivors' steps.
            if self._deferred:
                idle_threads(self.proc.pid)
            self._child.close()
            self._beat.value = time.monotonic()  # its stall clock starts with it
            # The worker ignores SIGTERM (Slurm signals every process of a step),
            # so multiprocessing's exit handler, which terminates and joins daemon
            # children, would wait forever: kill it first (atexit runs LIFO).
            atexit.register(self._kill)
            self.started = True

    def _kill(self) -> None:
        if self.started and self.proc.is_alive():
            self.proc.kill()

    @property
    def idle_s(self) -> float:
        """Seconds since the worker's last progress (see :func:`serve`)."""
        return time.monotonic() - self._beat.value

    @property
    def upload_lag_s(self) -> float | None:
        value = self._lag.value
        return None if value < 0 else value

    def send(self, *msg: Any) -> None:
        self.start()
        with self._lock:
            if msg[0] == "save":  # a save's clock starts when it is handed over
                self._beat.value = time.monotonic()
            self._conn.send(msg)

    def recv(self, kind: str, timeout_s: float | None = None) -> tuple[Any, ...] | None:
        """The next reply of ``kind`` (None on timeout). Raises if the worker died."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            for i, msg in enumerate(self._inbox):
                if msg[0] == kind:
                    return self._inbox.pop(i)
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self._conn.poll(left if left is not None else 1.0):
                if deadline is not None:
                    return None
                continue
            try:
                msg = self._conn.recv()
            except (EOFError, OSError):
                self.proc.join(5)
                raise RuntimeError(
                    f"checkpoint worker (pid {self.proc.pid}) died, exit code {self.proc.exitcode}"
                ) from None
            if msg[0] == "error":
                raise RuntimeError(f"checkpoint worker failed to start: {msg[1]}")
            self._inbox.append(msg)

    def close(self, timeout_s: float = 10.0) -> None:
        if not self.started:  # never needed: nothing to stop
            self._child.close()
            self._conn.close()
            return
        if self.proc.is_alive():
            with contextlib.suppress(BrokenPipeError, OSError):
                self.send("close")
            self.proc.join(timeout_s)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        self._conn.close()
