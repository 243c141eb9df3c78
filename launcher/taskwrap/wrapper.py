"""The task wrapper of ``job=script``: a team's own program on meshrun's machinery.

``python -m launcher.taskwrap <run_dir>`` is what every Slurm task (or
local rank) runs in place of the trainer's entry. It

- gives the program torchrun's variables from Slurm's (``RANK``,
  ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``,
  ``MASTER_ADDR``, ``MASTER_PORT``: ``init_process_group()`` with
  ``env://`` works unchanged), or, with ``job.launch=torchrun``, runs
  ``python -m torch.distributed.run`` once per node with a c10d rendezvous
  on the first node; plus meshrun's own (launcher/config/scriptjob.py);
- starts it (an argv list, never a shell; cwd = the packed project dir or
  ``job.workdir``) and tees its output to the task's and
  ``<run_dir>/logs/rank<R>.log``;
- turns the step numbers it prints (``job.progress_regex``) or writes to its
  progress file into the trainer's heartbeats (launcher/config/health.py:
  the supervisor's hang detection) and, from the task hosting the program's
  global rank 0 (under torchrun any node's: launcher/taskwrap/workers.py),
  ``metrics.jsonl`` step lines (status, goodput) and ``result.json``;
- on meshrun's stop signal (USR2 at the time limit or preemption, SIGTERM;
  taken from the wrapper's first line: launcher/taskwrap/stopsig.py)
  sends the program ``job.stop_signal``, waits at most the signal's window,
  and exits 75 (stopped: the batch script requeues; 76 when the program had
  to be killed), never counted as a failure; a stop before the program
  started: exit 75 at once, nothing started. Only this path exits 75/76;
- program exit 0: ``result.json`` completed; any other: ``failures.log``
  (its last error line) and the same exit (a signal death is re-raised; the
  program's own 75/76, a stop code with no stop, exits 1), so the supervisor
  attributes and restarts it as it does the trainer's ranks;
- its own failure before the program starts (a bad spec, a workdir copy
  that failed, an interpreter that cannot start): a ``failures.log`` line
  that says so (:data:`WRAPPER_ERROR`: the run's error, no node's).

Standard library only (no torch, no ``train``): it runs beside any program.
:class:`Wrapper` composes the parts, one module each: the program's process
and stop (child.py), its progress and heartbeats (progress.py), a hang's
stacks (stacks.py), the files it leaves (report.py). The mapping from
Slurm's task to the program's environment and argv is launcher/taskwrap/taskenv.py.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import sys
import threading
import time
import traceback
from collections import deque
from pathlib import Path
from typing import IO

from launcher.config.health import ATTEMPT_ENV

# The batch script's contract (exit 76: stopped, but the program had to be killed).
from launcher.config.runfiles import REQUEUE_EXIT_CODE, STACKS_DIR, STOP_EXIT_CODES, UNCOMMITTED_EXIT_CODE
from launcher.config.scriptjob import (
    CHECKPOINT_DIR,
    PROGRAM_EXIT,
    PROGRAM_START,
    PROGRESS_DIR,
    REQUEUE_ASKED,
    STOPPING_ENV,
    WRAPPER_ERROR,
    newest_match,
    progress_path,
)
from launcher.config.spec import LAUNCHER_PID_ENV, RunSpec, load_spec
from launcher.taskwrap.child import Child, die_of
from launcher.taskwrap.progress import Activity, Heartbeats, Output, ProgressFile, Steps, open_log
from launcher.taskwrap.report import Report, failure_text, how_ended, say
from launcher.taskwrap.stacks import Stacks
from launcher.taskwrap.stopsig import StopRequest
from launcher.taskwrap.taskenv import Ranks, program_argv, program_cwd, program_env, stop_window_s, task_ranks
from launcher.taskwrap.workers import Workers

POLL_S = 0.2
PROGRAM_STOP_CODE_EXIT = 1  # the program's own 75/76 with no stop: a failure, counted


class StartError(Exception):
    """The program could not be started (its interpreter, its cwd)."""


class Wrapper:
    """One task: the program started, watched (its output, its progress),
    stopped on meshrun's signal, and its end reported."""

    def __init__(
        self,
        spec: RunSpec,
        me: Ranks,
        argv: list[str],
        env: dict[str, str],
        cwd: str,
        resume: str = "",
        stop: StopRequest | None = None,
    ) -> None:
        self.spec, self.me, self.argv, self.env, self.cwd = spec, me, argv, env, cwd
        self.resume = resume  # the checkpoint job.resume_args named, "" for none
        self.run_dir = Path(spec.run_dir)
        j = spec.cfg.job
        self.pattern = re.compile(j.progress_regex) if j.progress_regex else None
        self.supervised = bool(env.get(ATTEMPT_ENV))
        self.stop = stop or StopRequest()  # installed first (launcher/taskwrap/__main__.py)
        self.stop.mark = env.get(STOPPING_ENV) or None  # read by meshrun's scontrol
        requeue_flag = self.run_dir / PROGRESS_DIR / REQUEUE_ASKED
        self.child = Child(argv, env, cwd, signal.Signals[j.stop_signal], requeue_flag)
        self.beats = Heartbeats(self.run_dir, me.reports, self.supervised, stopping=self.stop.asked,
                                node_ranks=me.local_world)  # fmt: skip
        # Who reports the program's steps and result: the task hosting its global rank 0.
        self.workers = Workers(self.run_dir, me, j.launch == "torchrun", env)
        self.steps = Steps(self.run_dir, self.workers.main, self.beats)
        self.progress_file = ProgressFile(progress_path(self.run_dir, me.rank))
        self.output = Output(self.pattern)
        self.activity = Activity(self.output)  # a quiet rank's work after rank 0 completed
        self.stacks = Stacks(self.run_dir, me.reports, env, j.launch == "torchrun", self.child, self.output)
        self.report = Report(self.run_dir, me.rank, env, main=self.workers.main)

    # What the output threads (and tests) call: the progress part's step
    # and the output part's tail, read through the task.
    @property
    def step(self) -> int | None:
        """The highest step the program reported."""
        return self.steps.step

    @property
    def tail(self) -> deque[str]:
        """The program's last output lines."""
        return self.output.tail

    def progress(self, step: int, loss: float | None, total: int | None = None) -> None:
        """A step the program reported (its output, its progress file), and
        the total its progress bar showed, if any."""
        self.steps.report(step, loss, total)

    def pump(self, src: IO[bytes], out: IO[str], log: IO[str] | None) -> None:
        """One of the program's output streams, copied and read for steps until it closes."""
        self.output.pump(src, out, log, on_step=self.progress)

    def run(self) -> int:
        """The task's exit code: the program started, watched until it ends
        (a stop passed on meanwhile), and its end reported."""
        self.stop.install()
        self.stacks.install()
        try:
            started = self.start()
        except Exception as e:  # the wrapper's own, before the program: the run's error
            code = wrapper_failed(self.report, e)
            self.beats.flush()
            return code
        return self.finish(self.watch()) if started else REQUEUE_EXIT_CODE

    # --- start ------------------------------------------------------------
    def start(self) -> bool:
        """The program started; False when a stop came first (it is not started)."""
        if self.stop.mark:  # an earlier start's: the shim must not answer for this one
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.stop.mark)
        subs = ("logs", CHECKPOINT_DIR, PROGRESS_DIR) + ((STACKS_DIR,) if self.supervised else ())
        for sub in subs:
            (self.run_dir / sub).mkdir(parents=True, exist_ok=True)
        self.beats.start(node_writer=self.me.local_rank == 0)
        if stopped_before_start(self.stop):
            self.beats.done(0)
            self.report.result("preempted", None, None)
            return False
        self.report.record_start(self.me.world)
        who = (
            f"node {self.me.node}'s {len(self.me.reports)} ranks (torchrun's rendezvous numbers them)"
            if self.workers.torchrun
            else f"rank {self.me.rank}"
        )
        say(f"{who} of {self.me.world}: {shlex.join(self.argv)} (in {self.cwd})")
        try:
            pid = self.child.start()
        except OSError as e:
            raise StartError(f"cannot start {self.argv[0]}: {e.strerror or e}") from e
        self.workers.start(pid)
        self.report.event(PROGRAM_START, pid=pid, **({"resume_from": self.resume} if self.resume else {}))
        return True

    # --- watch ------------------------------------------------------------
    def watch(self) -> int:
        """The program's return code, its output copied and read meanwhile."""
        proc = self.child.proc
        assert proc is not None and proc.stdout is not None and proc.stderr is not None
        # The local launcher logs each rank itself (launcher/run/local.py).
        log = None if os.environ.get(LAUNCHER_PID_ENV) else open_log(self.run_dir, self.me.rank)
        pumps = [
            threading.Thread(target=self.pump, args=(proc.stdout, sys.stdout, log), daemon=True),
            threading.Thread(target=self.pump, args=(proc.stderr, sys.stderr, log), daemon=True),
        ]
        for t in pumps:
            t.start()
        rc = self.wait()
        for t in pumps:
            t.join(5)
        if log is not None:
            log.close()
        return rc

    def wait(self) -> int:
        """The program's return code; a stop signal is passed on once, and
        the program ended when it outlives the signal's window."""
        while self.child.running():
            time.sleep(POLL_S)
            self.workers.poll()  # torchrun's workers' ranks, before their first step is read
            self.progress_file.poll(self.progress)
            if self.stop.asked() and not self.child.stopping:
                self.pass_stop()
            if self.child.stopping and (rc := self.child.end_stop(self.stop.at)) is not None:
                return rc
            if self.pattern is None:
                self.steps.keep_alive()
            if (active := self.activity.poll(self.child.pid, time.time())) is not None:
                self.beats.active(active)
        self.progress_file.poll(self.progress)
        return self.child.returncode()

    # --- stop -------------------------------------------------------------
    def pass_stop(self) -> None:
        """meshrun's stop to the program: its stop signal, the save phase, the signal's window."""
        assert self.stop.signum is not None
        self.stop.mark_stopping()  # made in the handler too; here again, the file certain
        window = stop_window_s(self.spec, self.stop.signum, self.env)
        self.child.send_stop(self.stop.signum, window)
        self.beats.beat("save", self.steps.step or 0)
        self.child.start_window(window)

    # --- report -----------------------------------------------------------
    def finish(self, rc: int) -> int:
        """The task's exit: 75/76 after a stop, 0 completed, else the failure."""
        step = self.steps.step or 0
        self.report.event(PROGRAM_EXIT, rc=rc, stopped=self.stop.asked())
        if self.stop.asked():
            self.beats.done(step)
            self.report.result("preempted", self.steps.step, self.steps.loss)
            return UNCOMMITTED_EXIT_CODE if self.child.killed else REQUEUE_EXIT_CODE
        if rc == 0:
            self.beats.beat("done", step)
            self.report.result("completed", self.steps.step, self.steps.loss)
            self.beats.close(linger=lambda: not self.stop.asked())
            return 0
        how = how_ended(rc)
        self.report.result("failed", self.steps.step, self.steps.loss, error=how)
        if rc in STOP_EXIT_CODES:
            # Its own exit code, not meshrun's stop: passed on, the supervisor
            # and the batch script would requeue it forever, uncounted.
            say(f"rank {self.me.rank}: the program's own {how} with no stop under way: a failure (exit 1)")
            how += " (meshrun's stop code, with no stop under way)"
        if rc >= 0:
            self.fail(failure_text(how, self.output.tail))
        else:
            # Die of the same signal, and write no failures.log line, as a
            # trainer rank would (a line would read as the code's error).
            say(f"rank {self.me.rank}: the program was {how}")
            die_of(-rc)
        return rc if 0 < rc < 256 and rc not in STOP_EXIT_CODES else PROGRAM_STOP_CODE_EXIT

    def fail(self, error: str) -> None:
        self.report.failure(error)
        self.beats.flush()  # the step it reached, for the supervisor's attribution, now


def stopped_before_start(stop: StopRequest) -> bool:
    """A stop came before the program started: it is not started (exit 75 at once)."""
    if not stop.asked():
        return False
    assert stop.signum is not None
    say(
        f"{signal.Signals(stop.signum).name} before the program started: not starting it (exit {REQUEUE_EXIT_CODE})"
    )
    return True


def wrapper_failed(report: Report, e: BaseException) -> int:
    """The wrapper's own failure before the program started: said, and a
    failures.log line naming it as the wrapper's (the run's error, not its
    node's: launcher/selfheal/attribution.py); exit 1."""
    traceback.print_exception(e, file=sys.stderr)
    what = str(e) if isinstance(e, StartError) else f"{type(e).__name__}: {e}"
    report.failure(f"{WRAPPER_ERROR} {what} (before the program started)")
    return 1


def prepare(run_dir: str, env: dict[str, str], stop: StopRequest) -> Wrapper | None:
    """The task's wrapper, its program not started; None when a stop came meanwhile."""
    spec = load_spec(run_dir)
    me = task_ranks(env, spec)
    child_env = program_env(env, spec, me)  # asks Slurm for the first node's name
    if stopped_before_start(stop):
        return None
    cwd = program_cwd(spec, env)  # the run's workdir copy: seconds on a busy file system
    # Where the program resumes (job.resume_from), chosen once per start.
    resume = newest_match(spec.cfg.job.resume_from, cwd)
    if stopped_before_start(stop):
        return None
    argv = program_argv(spec, me, child_env, cwd, resume)
    return Wrapper(spec, me, argv, child_env, cwd, resume, stop=stop)


def _task_rank(env: dict[str, str]) -> int:
    # The spec could not be read: Slurm's or torchrun's rank as it is.
    v = env.get("RANK") or env.get("SLURM_PROCID") or "0"
    return int(v) if v.isdigit() else 0


def main(argv: list[str] | None = None, stop: StopRequest | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m launcher.taskwrap RUN_DIR", file=sys.stderr)
        return 2
    stop = stop or StopRequest()
    stop.install()
    env = dict(os.environ)
    try:
        wrapper = prepare(argv[0], env, stop)
    except Exception as e:  # a bad spec, a workdir copy that failed, ...: the run's error
        return wrapper_failed(Report(Path(argv[0]), _task_rank(env), env), e)
    return REQUEUE_EXIT_CODE if wrapper is None else wrapper.run()
