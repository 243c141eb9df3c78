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
  the supervisor's hang detection) and rank 0's ``metrics.jsonl`` step
  lines (status, goodput);
- on meshrun's stop signal (USR2 at the time limit or preemption, SIGTERM)
  sends the program ``job.stop_signal``, waits at most the signal's window,
  and exits 75 (stopped: the batch script requeues; 76 when the program had
  to be killed), never counted as a failure;
- program exit 0: ``result.json`` completed; any other: ``failures.log``
  (its last error line) and the same exit (a signal death is re-raised), so
  the supervisor attributes and restarts it as it does the trainer's ranks.

Standard library only (no torch, no ``train``): it runs beside any program.
The mapping from Slurm's task to the program's environment and argv is
launcher/taskwrap/taskenv.py.
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from types import FrameType
from typing import IO

from launcher.config.health import (
    ATTEMPT_ENV,
    STACKS_DIR,
    NodeWriter,
    failure_line,
    stack_path,
    write_heartbeat,
)
from launcher.config.runrecord import record_start
from launcher.config.scriptjob import (
    CHECKPOINT_DIR,
    PROGRAM_EXIT,
    PROGRAM_START,
    PROGRESS_DIR,
    REQUEUE_ASKED,
    last_step_record,
    newest_match,
    parse_progress,
    progress_path,
    read_progress_file,
    step_record,
)
from launcher.config.spec import LAUNCHER_PID_ENV, RunSpec, load_spec

# The batch script's contract (exit 76: stopped, but the program had to be killed).
from launcher.slurm.render import FAILURES_FILE, REQUEUE_EXIT_CODE, UNCOMMITTED_EXIT_CODE
from launcher.taskwrap.taskenv import Ranks, program_argv, program_cwd, program_env, stop_window_s, task_ranks

POLL_S = 0.2
# job.progress_regex="" and no progress file yet: the start-up heartbeat is
# renewed this often (the program is alive; nothing more can be told).
LIVENESS_S = 60.0
ERROR_LINE = re.compile(
    r"^\s*(?:\[rank\d+\]:\s*)?(?:[\w.]+(?:Error|Exception|Interrupt|Exit)|[\w.]*Error)\b.*"
)
PR_SET_PDEATHSIG = 1
# A hang's stacks: the supervisor reads them STACK_WAIT_S (5 s) after its signal.
STACK_SETTLE_S = 1.5  # for the program's faulthandler dump to come through its stderr
STACK_LOOKBACK_S = 1.0  # its output this long before the wrapper's own signal is taken too
PY_SPY_TIMEOUT_S = 3.0
DUMP_MAX_CHARS = 1 << 18


def write_stacks(paths: list[Path], text: str) -> None:
    for p in paths:
        tmp = p.with_name(f".{p.name}.{os.getpid()}")
        with contextlib.suppress(OSError):
            tmp.write_text(text)
            os.replace(tmp, p)  # the supervisor reads whole files


def py_spy_dump(pid: int, python: str, env: dict[str, str], children: bool) -> str:
    """``py-spy dump`` of the program (its interpreter's bin dir, meshrun's,
    then PATH), "" when py-spy is not installed."""
    where = os.pathsep.join([os.path.dirname(python), os.path.dirname(sys.executable), env.get("PATH", "")])
    exe = shutil.which("py-spy", path=where)
    if not exe:
        return ""
    cmd = [exe, "dump", "--pid", str(pid), *(["--subprocesses"] if children else [])]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=PY_SPY_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"py-spy failed: {e}\n"
    return out.stdout + (f"py-spy exit {out.returncode}: {out.stderr}" if out.returncode else "")


def _child_setup() -> None:  # pragma: no cover - runs in the child between fork and exec
    # Meshrun's USR2 is the wrapper's: an ignored disposition survives exec, so
    # a program that does not handle USR2 is not killed by Slurm's (the
    # wrapper sends it job.stop_signal instead).
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    with contextlib.suppress(OSError, AttributeError):
        # Dies with the wrapper (a SIGKILLed task takes its program along).
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class Wrapper:
    """One task: the program, its output, its progress, its stop."""

    def __init__(
        self, spec: RunSpec, me: Ranks, argv: list[str], env: dict[str, str], cwd: str, resume: str = ""
    ) -> None:
        self.spec, self.me, self.argv, self.env, self.cwd = spec, me, argv, env, cwd
        self.resume = resume  # the checkpoint job.resume_args named, "" for none
        self.run_dir = Path(spec.run_dir)
        j = spec.cfg.job
        self.pattern = re.compile(j.progress_regex) if j.progress_regex else None
        self.stop_signal = signal.Signals[j.stop_signal]
        self.supervised = bool(env.get(ATTEMPT_ENV))
        # The node's one writer of heartbeats/node-<node>.json (local rank 0's task).
        self.writer: NodeWriter | None = None
        self.step: int | None = None  # the highest step reported
        self.said: int | None = None  # the last one
        self.loss: float | None = None
        self.last_step_at = time.time()
        self.tail: deque[str] = deque(maxlen=40)
        self.lock = threading.Lock()
        self.stop: int | None = None
        self.stop_at = 0.0  # when the stop came (time.time())
        self.proc: subprocess.Popen[bytes] | None = None
        self.progress_mtime = 0.0
        self.killed = False
        # The program's recent output, (time.monotonic(), text): a hang's stack
        # file takes its faulthandler's dump from it.
        self.recent: deque[tuple[float, str]] = deque(maxlen=4096)
        self.dumping = False

    # --- heartbeats and step lines ---------------------------------------
    def beat(self, phase: str, step: int) -> None:
        if not self.supervised:
            return
        if self.stop is not None and phase in ("warmup", "step"):
            # Stopping: the program saves (in a signal handler, as Lightning
            # does, its steps may stall); the save limit applies, and the
            # stop window's kill comes first.
            phase = "save"
        for r in self.me.reports:
            try:
                write_heartbeat(self.run_dir, r, phase, step)
            except OSError as e:  # health reporting never stops the program
                print(f"meshrun taskwrap: heartbeat not written: {e}", file=sys.stderr)
        if phase == "done" and self.writer is not None:
            self.writer.stop()  # the last beats reach the run dir before the task ends

    def progress(self, step: int, loss: float | None) -> None:
        """A step the program reported: a heartbeat (any new step number: a
        counter that starts again each epoch is still progress) and, past
        the highest so far, rank 0's step line (``self.step``: that highest)."""
        with self.lock:
            if step == self.said:
                return  # the same step again (another rank's line under torchrun, a repeated print)
            first = self.said is None
            self.said = step
            if loss is not None:
                self.loss = loss
            self.beat("warmup" if first else "step", step)
            if self.step is not None and step <= self.step:
                return
            now = time.time()
            # The first step's time is unknown (start-up, a resume come before it).
            dt, self.last_step_at = (0.0 if first else now - self.last_step_at), now
            self.step = step
            if self.me.rank == 0:
                with open(self.run_dir / "metrics.jsonl", "a") as f:
                    f.write(step_record(step, loss, dt, now) + "\n")

    # --- output ----------------------------------------------------------
    def pump(self, src: IO[bytes], out: IO[str], log: IO[str] | None) -> None:
        """Copy the program's output as it comes (not by line: a progress
        bar, tqdm's, redraws one line with carriage returns and ends it only
        when done) and read a step from each redraw and each line."""
        decode = codecs.getincrementaldecoder("utf-8")(errors="replace").decode
        read = getattr(src, "read1", src.readline)
        pending = ""
        while chunk := read(65536):
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
                self.read_step(*redraws, last)
                self.tail.append(last)
            *redraws, pending = pending.split("\r")
            self.read_step(*redraws)
        if pending:
            self.read_step(pending)
            self.tail.append(pending)

    def read_step(self, *parts: str) -> None:
        for part in parts:
            found = parse_progress(part, self.pattern)
            if found is not None:
                self.progress(*found)

    def poll_progress_file(self) -> None:
        path = progress_path(self.run_dir, self.me.rank)
        with contextlib.suppress(OSError):
            mtime = path.stat().st_mtime
            if mtime != self.progress_mtime:
                self.progress_mtime = mtime
                found = read_progress_file(path)
                if found is not None:
                    self.progress(*found)

    # --- signals ---------------------------------------------------------
    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.stop is None:
            self.stop = signum  # the loop sends the program its stop signal
            self.stop_at = time.time()

    def on_stack_signal(self, signum: int, frame: FrameType | None) -> None:
        """The supervisor asks for stacks (a hang). Answer at once with the
        program's state and what it last printed; then add its Python stacks:
        the dump its faulthandler writes to stderr (the stack hook,
        launcher/taskwrap/stackhook: Slurm signals every process of the step) and
        ``py-spy dump`` where py-spy is installed. A stopped program writes
        nothing, so the wrapper does not answer: its node is the one blamed."""
        proc = self.proc
        state = ""
        if proc is not None:
            with contextlib.suppress(OSError):
                state = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "T":
            return
        attempt = self.env.get(ATTEMPT_ENV, "")
        head = f"job=script program pid {proc.pid if proc else '-'} state {state or '?'}; last output:\n"
        head += "\n".join(self.tail) + "\n"
        paths = [stack_path(self.run_dir, attempt, r) for r in self.me.reports]
        write_stacks(paths, head)
        if proc is not None and not self.dumping:
            self.dumping = True
            args = (paths, head, proc.pid, time.monotonic())
            threading.Thread(target=self.complete_stacks, args=args, daemon=True).start()

    def complete_stacks(self, paths: list[Path], head: str, pid: int, since: float) -> None:
        """The stack files again, with the program's own dump (its output
        from just before the signal: Slurm signals the program and this
        wrapper at once, and the pumps may read its dump first), then with
        py-spy's too (within the supervisor's wait, launcher/selfheal/supervisor.py)."""
        time.sleep(max(0.0, since + STACK_SETTLE_S - time.monotonic()))
        dump = "".join(text for t, text in list(self.recent) if t >= since - STACK_LOOKBACK_S)[
            -DUMP_MAX_CHARS:
        ]
        parts = [head]
        if dump:
            parts.append("--- the program's output since the stack signal (its faulthandler) ---\n" + dump)
        write_stacks(paths, "\n".join(parts))
        spy = py_spy_dump(pid, self.argv[0], self.env, children=self.spec.cfg.job.launch == "torchrun")
        if spy:
            write_stacks(paths, "\n".join([*parts, f"--- py-spy dump --pid {pid} ---\n{spy}"]))
        self.dumping = False

    def install(self) -> None:
        for sig in (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.on_signal)
        signal.signal(signal.SIGURG, self.on_stack_signal)

    # --- the run ---------------------------------------------------------
    def start(self) -> None:
        subs = ("logs", CHECKPOINT_DIR, PROGRESS_DIR) + ((STACKS_DIR,) if self.supervised else ())
        for sub in subs:
            (self.run_dir / sub).mkdir(parents=True, exist_ok=True)
        self.beat("startup", 0)
        if self.supervised and self.me.local_rank == 0:
            self.writer = NodeWriter(self.run_dir)
            self.writer.start()
        if self.me.rank == 0:
            try:
                record_start(self.run_dir, self.me.world)
            except (OSError, ValueError) as e:
                print(f"meshrun taskwrap: start not recorded in run_record.json: {e}", file=sys.stderr)
        who = (
            f"ranks {self.me.reports[0]}-{self.me.reports[-1]}"
            if len(self.me.reports) > 1
            else f"rank {self.me.rank}"
        )
        say(f"{who} of {self.me.world}: {shlex.join(self.argv)} (in {self.cwd})")
        self.proc = subprocess.Popen(
            self.argv,
            cwd=self.cwd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=_child_setup,  # noqa: PLW1509 (signal disposition + parent-death signal only)
        )
        self.event(PROGRAM_START, pid=self.proc.pid, **({"resume_from": self.resume} if self.resume else {}))

    def run(self) -> int:
        self.install()
        try:
            self.start()
        except OSError as e:
            self.record_failure(f"cannot start {self.argv[0]}: {e.strerror or e}")
            return 1
        proc = self.proc
        assert proc is not None and proc.stdout is not None and proc.stderr is not None
        # The local launcher logs each rank itself (launcher/run/local.py).
        log = None if os.environ.get(LAUNCHER_PID_ENV) else self._log()
        pumps = [
            threading.Thread(target=self.pump, args=(proc.stdout, sys.stdout, log), daemon=True),
            threading.Thread(target=self.pump, args=(proc.stderr, sys.stderr, log), daemon=True),
        ]
        for t in pumps:
            t.start()
        rc = self.wait(proc)
        for t in pumps:
            t.join(5)
        if log is not None:
            log.close()
        return self.finish(rc)

    def _log(self) -> IO[str] | None:
        path = self.run_dir / "logs" / f"rank{self.me.rank}.log"
        try:
            return open(path, "a")  # noqa: SIM115 - closed at the end of run()
        except OSError as e:
            print(f"meshrun taskwrap: no log file {path}: {e}", file=sys.stderr)
            return None

    def wait(self, proc: subprocess.Popen[bytes]) -> int:
        """The program's return code; a stop signal is passed on once, and
        the program killed when it outlives the signal's window."""
        deadline: float | None = None
        while proc.poll() is None:
            time.sleep(POLL_S)
            self.poll_progress_file()
            if self.stop is not None and deadline is None:
                window = stop_window_s(self.spec, self.stop, self.env)
                say(
                    f"{signal.Signals(self.stop).name}: sending {self.stop_signal.name} to the program, "
                    f"{window:.0f} s to stop"
                )
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(self.stop_signal)
                self.beat("save", self.step or 0)
                deadline = time.monotonic() + window
            if deadline is not None and self.asked_requeue():
                say("the program asked for its requeue after its save: ended now, not at the window's end")
                proc.kill()
                return proc.wait()
            if deadline is not None and time.monotonic() > deadline:
                say(f"the program did not stop within the window: killed (exit {UNCOMMITTED_EXIT_CODE})")
                self.killed = True  # the work since its last save is lost
                proc.kill()
                return proc.wait()
            if self.pattern is None and self.step is None and time.time() - self.last_step_at > LIVENESS_S:
                # Progress neither parsed nor written yet: alive is all that can be told.
                self.last_step_at = time.time()
                self.beat("startup", 0)
        self.poll_progress_file()
        return proc.returncode

    def asked_requeue(self) -> bool:
        """Since this stop, the program (any rank) asked meshrun's scontrol
        to requeue its job: its own save is done (Lightning's SIGUSR1 handler
        saves, asks, and trains on until Slurm would kill it)."""
        try:
            return os.stat(self.run_dir / PROGRESS_DIR / REQUEUE_ASKED).st_mtime >= self.stop_at - 1
        except OSError:
            return False

    def event(self, name: str, **extra: object) -> None:
        """Rank 0's metrics.jsonl event (goodput places a program that
        reports no step by its start and exit: launcher/views/goodput.py)."""
        if self.me.rank != 0:
            return
        try:
            with open(self.run_dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps({"event": name, **extra, "time": time.time()}) + "\n")
        except OSError as e:
            print(f"meshrun taskwrap: {name} not recorded in metrics.jsonl: {e}", file=sys.stderr)

    def finish(self, rc: int) -> int:
        """The task's exit: 75/76 after a stop, 0 completed, else the failure."""
        step = self.step or 0
        self.event(PROGRAM_EXIT, rc=rc, stopped=self.stop is not None)
        if self.stop is not None:
            self.beat("done", step)
            if self.me.rank == 0:
                self.result("preempted")
            return UNCOMMITTED_EXIT_CODE if self.killed else REQUEUE_EXIT_CODE
        if rc == 0:
            self.beat("done", step)
            if self.me.rank == 0:
                self.result("completed")
            return 0
        how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit {rc}"
        if self.me.rank == 0:
            self.result("failed", error=how)
        if rc >= 0:
            errors = [line for line in self.tail if ERROR_LINE.match(line)]
            self.record_failure(f"{errors[-1].strip()} (program {how})" if errors else f"program {how}")
        else:
            # Die of the same signal, and write no failures.log line, as a
            # trainer rank would: srun then says "Killed" and the supervisor
            # blames the node by the signal (a line would read as the code's error).
            say(f"rank {self.me.rank}: the program was {how}")
            sys.stdout.flush()
            sys.stderr.flush()
            with contextlib.suppress(OSError, ValueError):  # SIGKILL's cannot be set, nor need be
                signal.signal(-rc, signal.SIG_DFL)
            os.kill(os.getpid(), -rc)
        return rc if 0 < rc < 256 else 1

    def result(self, status: str, **extra: str) -> None:
        # A start that reported no step (resumed at the end, as the HF Trainer
        # from its last checkpoint: its bar then reads "241it") ends where
        # the run's last reported step left it.
        last = (
            {"step": self.step, "loss": self.loss}
            if self.step is not None
            else last_step_record(self.run_dir / "metrics.jsonl")
        )
        doc = {"final_step": last.get("step", 0), "final_loss": last.get("loss"), "status": status, **extra}
        path = self.run_dir / "result.json"
        tmp = path.with_name(f".result.json.{os.getpid()}")
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps(doc))
            os.replace(tmp, path)

    def record_failure(self, error: str) -> None:
        """failures.log, as the trainer's ranks write it (the supervisor and
        the batch script read it): ``<job> <restart> rank <r> <time>: <error>``."""
        job = self.env.get("SLURM_JOB_ID", "local")
        restart = self.env.get("SLURM_RESTART_COUNT", "0") or "0"
        line = f"{job} {restart} rank {self.me.rank} {time.time():.3f}: {failure_line(error)}\n"
        say(f"rank {self.me.rank} failed: {error}")
        with contextlib.suppress(OSError), open(self.run_dir / FAILURES_FILE, "a") as f:
            f.write(line)
        if self.supervised:  # the step it reached, for the supervisor's attribution, now
            (self.writer or NodeWriter(self.run_dir)).flush()


def say(msg: str) -> None:
    print(f"meshrun taskwrap: {msg}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m launcher.taskwrap RUN_DIR", file=sys.stderr)
        return 2
    spec = load_spec(argv[0])
    env = dict(os.environ)
    me = task_ranks(env, spec)
    child_env = program_env(env, spec, me)
    cwd = program_cwd(spec, env)
    # Where the program resumes (job.resume_from), chosen once per start.
    resume = newest_match(spec.cfg.job.resume_from, cwd)
    return Wrapper(spec, me, program_argv(spec, me, child_env, cwd, resume), child_env, cwd, resume).run()
