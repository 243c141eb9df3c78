"""A job=script program's progress: its output read as it comes (the steps
it prints, ``job.progress_regex``), or its progress file, turned into the
trainer's heartbeats (launcher/config/health.py: the supervisor's hang
detection) and rank 0's ``metrics.jsonl`` step lines (status, goodput); and
a quiet rank's activity (its newest output or write: the heartbeat's
``active``), so that the teardown rule never ends a rank still working.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import IO

from launcher.config.health import ATTEMPT_ENV, NodeWriter, read_local_heartbeats, write_heartbeat
from launcher.config.runfiles import METRICS_FILE
from launcher.config.scriptjob import bar_total, parse_progress, read_progress_file, step_record
from launcher.taskwrap.workers import process_tree

# job.progress_regex="" and no progress file yet: the start-up heartbeat is
# renewed this often (the program is alive; nothing more can be told).
LIVENESS_S = 60.0
# A quiet rank's activity (output, bytes written) is read and beaten this
# often: the teardown limit it guards is a step limit, 120 s at least.
ACTIVE_S = 5.0
NODE_PEERS_POLL_S = 1.0  # a completed node writer's look at the node's other ranks
# A node peer with no beat yet may still be starting (a loaded node: seen in
# the full suite, a peer's first beat came after rank 0's program completed).
NODE_PEERS_START_S = 30.0

# A step the program reported, its loss and the total its progress bar showed (None: unknown).
OnStep = Callable[[int, float | None, int | None], None]


class Heartbeats:
    """This task's ranks' heartbeats; a supervised run's only (``MESHRUN_ATTEMPT`` set)."""

    def __init__(
        self,
        run_dir: Path,
        reports: list[int],
        supervised: bool,
        stopping: Callable[[], bool],
        node_ranks: int = 0,
    ) -> None:
        self.run_dir, self.reports, self.supervised = run_dir, reports, supervised
        self.node_ranks = node_ranks  # the node's ranks, this task's among them (0: unknown)
        self.stopping = stopping  # meshrun asked the task to stop
        # The node's one writer of heartbeats/node-<node>.json (local rank 0's task).
        self.writer: NodeWriter | None = None
        # Beats come from the output threads and the wrapper's loop: one at a time,
        # so an activity beat never writes back an older phase.
        self.lock = threading.Lock()
        self.last: tuple[str, int, float] | None = None  # phase, step, time of the newest beat
        self.active_at: float | None = None  # the program's newest output or write

    def start(self, node_writer: bool) -> None:
        """The start-up beat, and the node's writer on the task that is it."""
        self.beat("startup", 0)
        if self.supervised and node_writer:
            self.writer = NodeWriter(self.run_dir)
            self.writer.start()

    def beat(self, phase: str, step: int) -> None:
        if not self.supervised:
            return
        if self.stopping() and phase in ("warmup", "step"):
            # Stopping: the program saves (in a signal handler, as Lightning
            # does, its steps may stall); the save limit applies, and the
            # stop window's kill comes first.
            phase = "save"
        with self.lock:
            self.last = (phase, step, time.time())
            self._write(*self.last)

    def done(self, step: int) -> None:
        """The task's last beat, and the node's writer stopped after it."""
        self.beat("done", step)
        self.close()

    def close(self, linger: Callable[[], bool] | None = None) -> None:
        """The node's writer stopped (after the task's last beat: the last
        beats reach the run dir before the task ends). ``linger`` (rank 0's
        program completed): the node's file stays fresh while it holds and
        the node's other ranks still run: their activity and their own end
        reach the supervisor's teardown rule (a frozen file read as their
        silence, and ranks still writing were ended)."""
        if self.writer is None:
            return
        start_by = time.monotonic() + NODE_PEERS_START_S
        while linger is not None and linger() and self.node_peers_running(start_by):
            time.sleep(NODE_PEERS_POLL_S)
        self.writer.stop()

    def node_peers_running(self, start_by: float = 0.0) -> bool:
        """Another rank of this node and attempt has not said done, and its
        task lives; or, before ``start_by`` (monotonic), fewer of the node's
        other ranks have beaten than it holds: one may still be starting."""
        attempt = os.environ.get(ATTEMPT_ENV, "")
        seen = 0
        for r, h in read_local_heartbeats(self.run_dir).items():
            if r in self.reports or h.get("attempt") != attempt:
                continue
            seen += 1
            if h.get("phase") == "done":
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError, KeyError, TypeError, ValueError):
                os.kill(int(h["pid"]), 0)
                return True
        return seen < self.node_ranks - len(self.reports) and time.monotonic() < start_by

    def active(self, at: float) -> None:
        """The program was seen working at ``at``: a quiet rank's beat (one
        that reports no step) carries it, its own time unchanged (the hang
        limits still run from its last beat; only the teardown rule reads it)."""
        with self.lock:
            self.active_at = at
            if self.supervised and self.last is not None and self.last[0] == "startup":
                self._write(*self.last)

    def _write(self, phase: str, step: int, at: float) -> None:
        extra = {"active": self.active_at} if self.active_at is not None else None
        for r in self.reports:
            try:
                write_heartbeat(self.run_dir, r, phase, step, extra, at=at)
            except OSError as e:  # health reporting never stops the program
                print(f"meshrun taskwrap: heartbeat not written: {e}", file=sys.stderr)

    def flush(self) -> None:
        """The beats in the run dir now (a failure: the step it reached, for the supervisor's attribution)."""
        if self.supervised:
            (self.writer or NodeWriter(self.run_dir)).flush()


class Steps:
    """The steps the program reported (its output read on two threads, and the wrapper's loop)."""

    def __init__(self, run_dir: Path, main: Callable[[], bool], beats: Heartbeats) -> None:
        # main(): this task hosts the program's global rank 0, whose steps are the run's
        # (launcher/taskwrap/workers.py: under torchrun, any node's).
        self.run_dir, self.main, self.beats = run_dir, main, beats
        self.lock = threading.Lock()
        self.step: int | None = None  # the highest step reported
        self.said: int | None = None  # the last one
        self.loss: float | None = None
        self.total: int | None = None  # the steps to do, as the program's bar last showed them
        self.last_step_at = time.time()

    def report(self, step: int, loss: float | None, total: int | None = None) -> None:
        """A step the program reported: a heartbeat (any new step number: a
        counter that starts again each epoch is still progress) and, past
        the highest so far, global rank 0's step line (``self.step``: that highest)."""
        with self.lock:
            if step == self.said:
                return  # the same step again (another rank's line under torchrun, a repeated print)
            first = self.said is None
            self.said = step
            if loss is not None:
                self.loss = loss
            if total is not None:
                self.total = total
            self.beats.beat("warmup" if first else "step", step)
            if self.step is not None and step <= self.step:
                return
            now = time.time()
            # The first step's time is unknown (start-up, a resume come before it).
            dt, self.last_step_at = (0.0 if first else now - self.last_step_at), now
            self.step = step
            if self.main():
                with open(self.run_dir / METRICS_FILE, "a") as f:
                    f.write(step_record(step, loss, dt, now, self.total) + "\n")

    def keep_alive(self) -> None:
        """No progress parsed nor written yet: alive is all that can be told."""
        if self.step is None and time.time() - self.last_step_at > LIVENESS_S:
            self.last_step_at = time.time()
            self.beats.beat("startup", 0)


class ProgressFile:
    """The rank's progress file (``MESHRUN_PROGRESS_FILE``), read when it changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.mtime = 0.0

    def poll(self, on_step: OnStep) -> None:
        with contextlib.suppress(OSError):
            mtime = self.path.stat().st_mtime
            if mtime != self.mtime:
                self.mtime = mtime
                found = read_progress_file(self.path)
                if found is not None:
                    on_step(*found, None)


class Output:
    """The program's output: copied as it comes, read for steps, its last
    lines (a failure's error, a hang's stack file) and its recent text
    (a hang's faulthandler dump) kept."""

    def __init__(self, pattern: re.Pattern[str] | None) -> None:
        self.pattern = pattern
        self.tail: deque[str] = deque(maxlen=40)
        self.last_output = 0.0  # when it last wrote anything (time.time())
        # (time.monotonic(), text) as it came.
        self.recent: deque[tuple[float, str]] = deque(maxlen=4096)

    def pump(self, src: IO[bytes], out: IO[str], log: IO[str] | None, on_step: OnStep) -> None:
        """Copy the program's output as it comes (not by line: a progress
        bar, tqdm's, redraws one line with carriage returns and ends it only
        when done) and read a step from each redraw and each line."""
        decode = codecs.getincrementaldecoder("utf-8")(errors="replace").decode
        read = getattr(src, "read1", src.readline)
        pending = ""
        while chunk := read(65536):
            self.last_output = time.time()
            text = decode(chunk)
            out.write(text)
            out.flush()
            self.recent.append((time.monotonic(), text))
            if log is not None:
                log.write(text)
                log.flush()
            *lines, pending = (pending + text).split("\n")
            for line in lines:
                *redraws, last = line.split("\r")
                self.read_step(on_step, *redraws, last)
                self.tail.append(last)
            *redraws, pending = pending.split("\r")
            self.read_step(on_step, *redraws)
        if pending:
            self.read_step(on_step, pending)
            self.tail.append(pending)

    def read_step(self, on_step: OnStep, *parts: str) -> None:
        for part in parts:
            found = parse_progress(part, self.pattern)
            if found is not None:
                on_step(*found, bar_total(part, found[0]))

    def since(self, t: float) -> str:
        """What the program wrote from ``t`` (time.monotonic()) on."""
        return "".join(text for at, text in list(self.recent) if at >= t)


def tree_wchar(pid: int) -> int | None:
    """The bytes the process and its descendants wrote so far (``wchar`` of
    /proc/<pid>/io: files, pipes; torchrun's workers are its children); None
    where none can be read. A child that ended takes its bytes along: read
    any change, not growth, as work."""
    total, found = 0, False
    for p in process_tree(pid):
        try:
            text = Path(f"/proc/{p}/io").read_text()
            io = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
            total, found = total + int(io["wchar"]), True
        except (OSError, KeyError, ValueError):
            continue
    return total if found else None


class Activity:
    """When the program last showed work: its output, or bytes it (or its
    children) wrote; read every :data:`ACTIVE_S`."""

    def __init__(self, output: Output) -> None:
        self.output = output
        self.wchar: int | None = None
        self.said = 0.0  # the newest activity given to the heartbeat
        self.next = 0.0

    def poll(self, pid: int | None, now: float) -> float | None:
        """The time of its newest activity when newer than the last one said, else None."""
        if pid is None or now < self.next:
            return None
        self.next = now + ACTIVE_S
        seen = self.output.last_output
        wrote = tree_wchar(pid)
        if wrote is not None:
            if self.wchar is not None and wrote != self.wchar:
                seen = max(seen, now)
            self.wchar = wrote
        if seen <= self.said:
            return None
        self.said = seen
        return seen


def open_log(run_dir: Path, rank: int) -> IO[str] | None:
    """``<run_dir>/logs/rank<R>.log``, appended to; None when it cannot be opened."""
    path = run_dir / "logs" / f"rank{rank}.log"
    try:
        return open(path, "a")  # noqa: SIM115 - the caller closes it when the program has ended
    except OSError as e:
        print(f"meshrun taskwrap: no log file {path}: {e}", file=sys.stderr)
        return None
