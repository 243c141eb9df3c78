"""A hang's stacks of a job=script program: on the supervisor's stack signal
(SIGURG) the rank's stack file gets the program's state and last output at
once, then the dump its faulthandler writes to stderr (meshrun's stack hook,
launcher/taskwrap/stackhook: Slurm signals every process of the step), then
``py-spy dump`` of it where py-spy is installed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from launcher.config.health import ATTEMPT_ENV, stack_path
from launcher.taskwrap.child import Child
from launcher.taskwrap.progress import Output

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


def process_state(pid: int) -> str:
    """The process's state letter in /proc (``T``: stopped), "" when unknown."""
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return ""


class Stacks:
    """The answer to the supervisor's stack signal for this task's ranks."""

    def __init__(
        self,
        run_dir: Path,
        reports: list[int],
        env: dict[str, str],
        children: bool,
        program: Child,
        output: Output,
    ) -> None:
        self.run_dir, self.reports, self.env = run_dir, reports, env
        self.children = children  # torchrun's agent: the program's ranks are its subprocesses
        self.program, self.output = program, output
        self.dumping = False

    def install(self) -> None:
        signal.signal(signal.SIGURG, self.on_signal)

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        """The supervisor asks for stacks (a hang). Answer at once with the
        program's state and what it last printed; then add its Python stacks
        (:meth:`complete`). A stopped program writes nothing, so the wrapper
        does not answer: its node is the one blamed."""
        pid = self.program.pid
        state = process_state(pid) if pid is not None else ""
        if state == "T":
            return
        attempt = self.env.get(ATTEMPT_ENV, "")
        head = (
            f"job=script program pid {pid if pid is not None else '-'} state {state or '?'}; last output:\n"
        )
        head += "\n".join(self.output.tail) + "\n"
        paths = [stack_path(self.run_dir, attempt, r) for r in self.reports]
        write_stacks(paths, head)
        if pid is not None and not self.dumping:
            self.dumping = True
            args = (paths, head, pid, time.monotonic())
            threading.Thread(target=self.complete, args=args, daemon=True).start()

    def complete(self, paths: list[Path], head: str, pid: int, since: float) -> None:
        """The stack files again, with the program's own dump (its output
        from just before the signal: Slurm signals the program and this
        wrapper at once, and the pumps may read its dump first), then with
        py-spy's too (within the supervisor's wait, launcher/selfheal/supervisor.py)."""
        time.sleep(max(0.0, since + STACK_SETTLE_S - time.monotonic()))
        dump = self.output.since(since - STACK_LOOKBACK_S)[-DUMP_MAX_CHARS:]
        parts = [head]
        if dump:
            parts.append("--- the program's output since the stack signal (its faulthandler) ---\n" + dump)
        write_stacks(paths, "\n".join(parts))
        spy = py_spy_dump(pid, self.program.argv[0], self.env, children=self.children)
        if spy:
            write_stacks(paths, "\n".join([*parts, f"--- py-spy dump --pid {pid} ---\n{spy}"]))
        self.dumping = False
