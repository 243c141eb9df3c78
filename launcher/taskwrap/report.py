"""What a job=script task leaves behind for the supervisor, the batch script and
the run's readers: global rank 0's ``result.json``, ``run_record.json`` start and
``metrics.jsonl`` events, every rank's ``failures.log`` line (as the
trainer's ranks write it), and the wrapper's own lines on the task's stderr.

The task's exit code, the other thing they read, is the wrapper's answer
(launcher/taskwrap/wrapper.py): it needs the stop and the program's end.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from launcher.config.health import failure_line
from launcher.config.runfiles import FAILURES_FILE, METRICS_FILE, RESULT_FILE
from launcher.config.runrecord import record_start
from launcher.config.scriptjob import last_step_record

ERROR_LINE = re.compile(
    r"^\s*(?:\[rank\d+\]:\s*)?(?:[\w.]+(?:Error|Exception|Interrupt|Exit)|[\w.]*Error)\b.*"
)


def say(msg: str) -> None:
    print(f"meshrun taskwrap: {msg}", file=sys.stderr, flush=True)


def how_ended(rc: int) -> str:
    """The program's end in words: ``exit 1``, ``killed by SIGKILL``."""
    return f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit {rc}"


def failure_text(how: str, tail: Iterable[str]) -> str:
    """The error of a failed program: the last error line of its output, with how it ended."""
    errors = [line for line in tail if ERROR_LINE.match(line)]
    return f"{errors[-1].strip()} (program {how})" if errors else f"program {how}"


class Report:
    """One task's files in the run dir: task 0 writes the run's start and
    the program's start and exit; the task hosting the program's global rank
    0 (``main``: under torchrun, any node's) its result."""

    def __init__(
        self, run_dir: Path, rank: int, env: dict[str, str], main: Callable[[], bool] | None = None
    ) -> None:
        self.run_dir, self.rank, self.env = run_dir, rank, env
        self.main = main or (lambda: rank == 0)

    def record_start(self, world: int) -> None:
        if self.rank != 0:
            return
        try:
            record_start(self.run_dir, world)
        except (OSError, ValueError) as e:
            print(f"meshrun taskwrap: start not recorded in run_record.json: {e}", file=sys.stderr)

    def event(self, name: str, **extra: object) -> None:
        """Rank 0's metrics.jsonl event (goodput places a program that
        reports no step by its start and exit: launcher/views/goodput.py)."""
        if self.rank != 0:
            return
        try:
            with open(self.run_dir / METRICS_FILE, "a") as f:
                f.write(json.dumps({"event": name, **extra, "time": time.time()}) + "\n")
        except OSError as e:
            print(f"meshrun taskwrap: {name} not recorded in metrics.jsonl: {e}", file=sys.stderr)

    def result(self, status: str, step: int | None, loss: float | None, **extra: str) -> None:
        """Global rank 0's result.json: the program's last reported step and loss, and how it ended."""
        if not self.main():
            return
        # A start that reported no step (resumed at the end, as the HF Trainer
        # from its last checkpoint: its bar then reads "241it") ends where
        # the run's last reported step left it.
        last = (
            {"step": step, "loss": loss}
            if step is not None
            else last_step_record(self.run_dir / METRICS_FILE)
        )
        doc = {"final_step": last.get("step", 0), "final_loss": last.get("loss"), "status": status, **extra}
        path = self.run_dir / RESULT_FILE
        tmp = path.with_name(f".result.json.{os.getpid()}")
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps(doc))
            os.replace(tmp, path)

    def failure(self, error: str) -> None:
        """failures.log, as the trainer's ranks write it (the supervisor and
        the batch script read it): ``<job> <restart> rank <r> <time>: <error>``."""
        job = self.env.get("SLURM_JOB_ID", "local")
        restart = self.env.get("SLURM_RESTART_COUNT", "0") or "0"
        line = f"{job} {restart} rank {self.rank} {time.time():.3f}: {failure_line(error)}\n"
        say(f"rank {self.rank} failed: {error}")
        with contextlib.suppress(OSError), open(self.run_dir / FAILURES_FILE, "a") as f:
            f.write(line)
