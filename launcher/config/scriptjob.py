"""The contract of ``job=script``: what a team's own program gets from
meshrun and what meshrun reads back from it (docs/your-code.md).

Standard library only: the launcher checks and renders with it, the task
wrapper (launcher/taskwrap/wrapper.py) runs with it on every node.

The program gets torchrun's variables (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``: ``init_process_group()`` with ``env://`` works unchanged)
and :data:`RUN_DIR_ENV`, :data:`CHECKPOINT_DIR_ENV` (``<run_dir>/checkpoints``,
created), :data:`PROGRESS_FILE_ENV` (a file it may write its step number
into, or ``{"step": N, "loss": X}``). Its progress is a step number in its
output (``job.progress_regex``, its first group that matched) or in that file.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

RUN_DIR_ENV = "MESHRUN_RUN_DIR"
CHECKPOINT_DIR_ENV = "MESHRUN_CHECKPOINT_DIR"
PROGRESS_FILE_ENV = "MESHRUN_PROGRESS_FILE"
# The packed copy of job.workdir a Slurm job runs (launcher/run/codesnap.py),
# exported by the batch script; absent: job.workdir itself.
PROJECT_DIR_ENV = "MESHRUN_PROJECT_DIR"
PROGRESS_DIR = "progress"  # <run_dir>/progress/rank<R>: each rank's progress file
# Touched by meshrun's scontrol when the program asks to requeue its job
# (launcher/taskwrap/bin/scontrol): it has saved, the stop need not wait longer.
REQUEUE_ASKED_ENV = "MESHRUN_REQUEUE_ASKED_FILE"
REQUEUE_ASKED = "requeue_asked"
# Made by the wrapper when meshrun's stop reaches its task (removed at each
# start): only then is the program's own `scontrol requeue` of its job
# answered by the shim; otherwise it is Slurm's (a self-chaining program).
STOPPING_ENV = "MESHRUN_STOPPING_FILE"
# The first words of a failures.log line the wrapper writes for its own
# failure before the program started (a bad spec, a workdir copy that
# failed, an interpreter that cannot start): the run's error, not a node's
# (launcher/selfheal/attribution.py).
WRAPPER_ERROR = "meshrun taskwrap error:"
CHECKPOINT_DIR = "checkpoints"
PROJECT_MARKERS = (".git", "pyproject.toml")
# A loss next to the step in the same line (optional; metrics.jsonl's "loss").
LOSS_RE = re.compile(r"(?i)(?<![a-z0-9])loss\s*[:=]?\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)")


def project_root(script: str) -> str:
    """The nearest parent of ``script`` holding .git or pyproject.toml, else its dir."""
    here = Path(script).resolve().parent
    for d in (here, *here.parents):
        if any((d / m).exists() for m in PROJECT_MARKERS):
            return str(d)
    return str(here)


def tasks_per_node(kind: str, launch: str, ranks_per_node: int) -> int:
    """Slurm tasks per node: one per rank, or one torchrun per node."""
    return 1 if kind == "script" and launch == "torchrun" else ranks_per_node


def progress_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(run_dir) / PROGRESS_DIR / f"rank{rank}"


def stopping_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    """The task's stop mark (:data:`STOPPING_ENV`); ``rank``: the task's first rank."""
    return Path(run_dir) / PROGRESS_DIR / f"stopping-rank{rank}"


def workers_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    """Under job.launch=torchrun, the global ranks a task's workers took
    (torchrun's c10d rendezvous may put global rank 0 on any node), with
    the task's log (``log_rank``: ``logs/rank<R>.log``) and Slurm task
    (``task``: ``slurm/<job>_<task>_log.out``); ``rank``: the task's first
    rank, its log's (launcher/taskwrap/workers.py writes it)."""
    return Path(run_dir) / PROGRESS_DIR / f"workers-rank{rank}.json"


def read_workers(run_dir: str | os.PathLike[str]) -> dict[int, dict[str, Any]]:
    """Global rank -> the newest torchrun task record naming it ({} for a
    run with none: one task per rank, whose log is its rank's). A record
    of an earlier start (a shrink left fewer nodes) loses to a newer one."""
    out: dict[int, dict[str, Any]] = {}
    folder = Path(run_dir) / PROGRESS_DIR
    for path in sorted(folder.glob("workers-rank*.json")) if folder.is_dir() else ():
        try:
            doc = json.loads(path.read_text())
            ranks = [int(r) for r in doc["ranks"]]
            at = float(doc.get("time") or 0.0)
        except (OSError, ValueError, TypeError, KeyError):
            continue  # being written, or not ours
        for r in ranks:
            if r not in out or at > float(out[r].get("time") or 0.0):
                out[r] = doc
    return out


def is_wrapper_error(error: str) -> bool:
    """A failures.log error the wrapper wrote for itself (:data:`WRAPPER_ERROR`)."""
    return error.startswith(WRAPPER_ERROR)


def parse_progress(line: str, pattern: re.Pattern[str] | None) -> tuple[int, float | None] | None:
    """(step, loss or None) of one output line, None when it reports no step."""
    if pattern is None:
        return None
    m = pattern.search(line)
    step = next((g for g in m.groups() if g is not None), None) if m else None
    if step is None or not step.isdigit():
        return None
    loss = LOSS_RE.search(line)
    return int(step), float(loss.group(1)) if loss else None


# A tqdm bar's count and total: "12/500 [" (an unknown total, "12/?", has none).
_BAR_TOTAL = r"(?<![\d/]){step}/(\d+) \["


def bar_total(line: str, step: int) -> int | None:
    """The total a progress bar shows beside ``step`` (tqdm's ``12/500 [``:
    500), None when the line shows none (a ``step 12`` line, a ``12/?`` bar)."""
    m = re.search(_BAR_TOTAL.format(step=step), line)
    total = int(m.group(1)) if m else 0
    return total or None


def read_progress_file(path: str | os.PathLike[str]) -> tuple[int, float | None] | None:
    """(step, loss) a program wrote into its progress file: ``N`` or ``{"step": N, "loss": X}``."""
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    try:
        doc: Any = json.loads(text)
    except ValueError:
        return None  # a write in progress
    if isinstance(doc, int) and not isinstance(doc, bool):
        return doc, None
    if isinstance(doc, dict) and isinstance(doc.get("step"), int):
        loss = doc.get("loss")
        return doc["step"], float(loss) if isinstance(loss, (int, float)) else None
    return None


# job=script's program starts and exits, rank 0's metrics.jsonl events
# (launcher/taskwrap/wrapper.py): a program that reports no step still has
# restarts and wall-clock goodput (launcher/views/goodput.py).
PROGRAM_START, PROGRAM_EXIT = "program_start", "program_exit"


def step_record(
    step: int, loss: float | None, step_time_s: float, now: float, total: int | None = None
) -> str:
    """One metrics.jsonl step line in the trainer's key order (step, loss
    first, time last: launcher/views/goodput.py reads them by that shape);
    ``total``: the steps to do its progress bar showed (status and fleet's
    STEP n/total for a program whose config says none), left out when unknown."""
    rec: dict[str, Any] = {"step": step, "loss": loss, "step_time_s": round(step_time_s, 6)}
    if total is not None:
        rec["total"] = total
    rec["time"] = now
    return json.dumps(rec)


def last_step_record(path: str | os.PathLike[str], tail_bytes: int = 16384) -> dict[str, Any]:
    """The newest step line of a metrics.jsonl (reads only the file's end),
    {} for none."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - tail_bytes))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return {}
    for line in reversed(lines):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and "loss" in rec and "step" in rec:
            return rec
    return {}


# job.resume_from / job.resume_args: the placeholders an argument may hold.
RESUME_FIELDS = ("path", "dir")
_PLACEHOLDER = re.compile(r"\{(" + "|".join(RESUME_FIELDS) + r")\}")
_NUMBERS = re.compile(r"(\d+)")


def _natural(path: str) -> list[tuple[int, int | str]]:
    # checkpoint-10 after checkpoint-9: numbers compare as numbers.
    return [(1, int(p)) if p.isdigit() else (0, p) for p in _NUMBERS.split(path)]


def newest_match(pattern: str, cwd: str | os.PathLike[str]) -> str:
    """The newest path matching ``pattern`` (relative to ``cwd``, or
    absolute): the last in the natural order of their numbers, as the HF
    Trainer's checkpoint-N; "" when nothing matches."""
    if not pattern:
        return ""
    base, typed = Path(cwd), pattern
    if Path(pattern).is_absolute():
        base, pattern = Path(pattern).anchor, str(Path(pattern).relative_to(Path(pattern).anchor))
    try:
        hits = [str(p) for p in Path(base).glob(pattern)]
    except IndexError as e:  # pathlib's answer to a pattern with no component ("/", ".")
        raise ValueError(f"{typed!r} names no file, only a folder") from e
    return max(hits, key=_natural) if hits else ""


def resume_pattern_problem(pattern: str) -> str | None:
    """Why ``job.resume_from`` cannot be globbed (checked at validation, so
    no task's wrapper dies on it); None when it can."""
    try:
        # A folder that does not exist: pathlib parses the pattern, reads nothing.
        newest_match(pattern, "/nonexistent/meshrun-resume-check")
    except ValueError as e:
        return str(e)
    return None


def resume_argv(args: list[str], newest: str) -> list[str]:
    """``job.resume_args`` with {path} the newest match and {dir} its folder;
    nothing when there is no match (the program's first start)."""
    if not newest:
        return []
    fields = {"path": newest, "dir": str(Path(newest).parent)}
    return [_PLACEHOLDER.sub(lambda m: fields[m.group(1)], a) for a in args]
