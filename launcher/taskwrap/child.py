"""The program's lifetime under a job=script task: started (an argv list,
never a shell) with meshrun's USR2 kept from it and the wrapper's death
its own, meshrun's stop signals taken by the wrapper and passed on as
``job.stop_signal`` with the signal's window to stop in, and a death by a
signal passed on to the task.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from launcher.config.runfiles import UNCOMMITTED_EXIT_CODE
from launcher.taskwrap.report import say

PR_SET_PDEATHSIG = 1


def _child_setup() -> None:  # pragma: no cover - runs in the child between fork and exec
    # Meshrun's USR2 is the wrapper's: an ignored disposition survives exec, so
    # a program that does not handle USR2 is not killed by Slurm's (the
    # wrapper sends it job.stop_signal instead).
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    with contextlib.suppress(OSError, AttributeError):
        # Dies with the wrapper (a SIGKILLed task takes its program along).
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def requeue_asked(flag: Path, since: float) -> bool:
    """Since ``since`` (a stop), the program (any rank) asked meshrun's
    scontrol to requeue its job: its own save is done (Lightning's SIGUSR1
    handler saves, asks, and trains on until Slurm would kill it)."""
    try:
        return os.stat(flag).st_mtime >= since - 1
    except OSError:
        return False


class Child:
    """The program's process: started, told to stop, ended when it outlives its window."""

    def __init__(
        self, argv: list[str], env: dict[str, str], cwd: str, stop_signal: signal.Signals, requeue_flag: Path
    ) -> None:
        self.argv, self.env, self.cwd = argv, env, cwd
        self.stop_signal = stop_signal
        self.requeue_flag = requeue_flag  # touched by meshrun's scontrol (launcher/taskwrap/bin/scontrol)
        self.proc: subprocess.Popen[bytes] | None = None
        self.deadline: float | None = None  # the stop window's end (time.monotonic())
        self.killed = False  # at the window's end: the work since its last save is lost

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def stopping(self) -> bool:
        return self.deadline is not None

    def start(self) -> int:
        """The program started, its output piped to the wrapper; its pid."""
        self.proc = subprocess.Popen(
            self.argv,
            cwd=self.cwd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=_child_setup,  # noqa: PLW1509 (signal disposition + parent-death signal only)
        )
        return self.proc.pid

    def running(self) -> bool:
        assert self.proc is not None
        return self.proc.poll() is None

    def returncode(self) -> int:
        assert self.proc is not None and self.proc.returncode is not None
        return self.proc.returncode

    def send_stop(self, signum: int, window: float) -> None:
        """``job.stop_signal`` to the program, for meshrun's ``signum``."""
        assert self.proc is not None
        say(
            f"{signal.Signals(signum).name}: sending {self.stop_signal.name} to the program, "
            f"{window:.0f} s to stop"
        )
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(self.stop_signal)

    def start_window(self, window: float) -> None:
        self.deadline = time.monotonic() + window

    def end_stop(self, since: float) -> int | None:
        """While it stops: its return code once it is ended, at its requeue
        request (its save is done) or at the window's end; None meanwhile."""
        assert self.proc is not None and self.deadline is not None
        if requeue_asked(self.requeue_flag, since):
            say("the program asked for its requeue after its save: ended now, not at the window's end")
            self.proc.kill()
            return self.proc.wait()
        if time.monotonic() > self.deadline:
            say(f"the program did not stop within the window: killed (exit {UNCOMMITTED_EXIT_CODE})")
            self.killed = True
            self.proc.kill()
            return self.proc.wait()
        return None


def die_of(signum: int) -> None:
    """The task dies of the signal that killed its program, as a trainer
    rank would: srun then says "Killed" and the supervisor blames the node
    by the signal."""
    sys.stdout.flush()
    sys.stderr.flush()
    with contextlib.suppress(OSError, ValueError):  # SIGKILL's cannot be set, nor need be
        signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
