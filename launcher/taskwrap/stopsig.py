"""meshrun's stop signals to a job=script task, taken from the wrapper's
first line to its last.

launcher/taskwrap/__main__.py installs :class:`StopRequest` before it
imports anything else (loading the spec, the environment, the run's
workdir copy and the resume glob come after, and take seconds on a busy
file system): a stop in that span is kept, never the signal's default
death (srun's exit 140, read as a node's fault). After the task's answer is
decided, :func:`ignore_stops` keeps a late one (the supervisor's forwarded
USR2) from killing the interpreter as it exits: Python puts the default
action back while it finalizes.

Standard library only, and nothing of meshrun's: it runs first.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from types import FrameType

# meshrun's stop signals to the task: USR2 at the time limit or preemption, SIGTERM, SIGINT.
STOP_SIGNALS = (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)


class StopRequest:
    """The first of meshrun's stop signals this task got (a second changes nothing)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.at = 0.0  # when it came (time.time())
        # The file meshrun's scontrol reads (launcher/taskwrap/bin/scontrol): a
        # stop is under way, so the program's own requeue is answered, not run.
        # Touched here, in the handler, before the program can get the signal.
        self.mark: str | None = None

    def install(self) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, self.on_signal)

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum  # the wrapper's loop sends the program its stop signal
            self.at = time.time()
            self.mark_stopping()

    def mark_stopping(self) -> None:
        """The scontrol shim's file, once a stop came and the wrapper knows where it is."""
        if self.signum is None or not self.mark:
            return
        with contextlib.suppress(OSError):
            os.close(os.open(self.mark, os.O_CREAT | os.O_WRONLY, 0o644))

    def asked(self) -> bool:
        return self.signum is not None


def ignore_stops() -> None:
    """The task's answer is decided: a stop signal now changes nothing (an
    ignored signal stays ignored while the interpreter finalizes; a handled
    one goes back to its default action, death)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
