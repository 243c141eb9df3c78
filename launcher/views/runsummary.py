"""One run's state over its whole life, computed once.

``meshrun status``, ``meshrun fleet`` (its table, ``--json`` and the web
page), :class:`launcher.api.Run` and ``goodput.json`` all read
:func:`summarize`'s :class:`RunSummary`: state, last step, restarts, faults,
redone steps and GPU-seconds cannot disagree, because no view counts them
itself.

A run's life is every job its run dir ever had (``slurm/job.json``'s
``jobs``: the first, a continuation in the same run dir, ...; a requeue
keeps its job id and sacct lists each of its starts), so its goodput and
GPU-seconds add up over all of them and never go down when a later job
starts. What the run is decides what it shows: a trainer run its model,
``train.steps`` and tokens; a ``job=script`` run (a Hydra app under
``meshrun_slurm`` too) its program and arguments, its own steps, and a
total only when known (``job.total_steps``, or a ``total`` its progress
records carry). An unknown figure is None (``-`` on screen), never 0.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.config.runfiles import METRICS_FILE, RESULT_FILE, SPEC_FILE
from launcher.config.scriptjob import last_step_record
from launcher.slurm.submit import read_job_ids
from launcher.views import goodput as gp
from launcher.views.localrun import is_local, local_state

# Job kinds whose steps are the trainer's (train.steps, tokens = step x batch x seq_len).
TRAINER_KINDS = ("pretrain", "finetune")
# The Hydra point runner meshrun_slurm gives job=script (its args: a pickle, a result file).
HYDRA_TASK = "meshrun_slurm/task.py"


@dataclass
class RunSummary:
    run_dir: str
    job_ids: list[str] = field(default_factory=list)  # oldest first
    state: str = "UNKNOWN"
    kind: str = ""  # job.kind
    program: str = ""  # a script run: "NAME ARGS"; a trainer run: its job kind
    model: str | None = None  # model.name; None for job=script
    last_step: int | None = None
    total_steps: int | None = None
    loss: float | None = None
    tokens_per_s: float | None = None
    tokens: float | None = None
    restarts: int | None = None
    recoveries: int | None = None  # in-process recoveries (launcher.in_process_recovery)
    faults: int = 0
    redone_steps: int | None = None
    gpu_s: float | None = None
    gpus: int = 0
    nodes: int = 0
    elapsed_s: float | None = None  # wall seconds of every start, all jobs
    ettr: float | None = None
    degraded_share: float = 0.0
    final: bool = False
    goodput: dict[str, Any] | None = None
    note: str = ""  # goodput.json not written: why

    @property
    def job_id(self) -> str | None:
        return self.job_ids[-1] if self.job_ids else None


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def life_job_ids(run_dir: str | Path, job_id: str | None = None) -> list[str]:
    """Every job of the run (job.json's history), plus ``job_id`` when the
    record does not name it (a sweep point's id from its manifest)."""
    ids = read_job_ids(run_dir)
    return ids + [job_id] if job_id and job_id not in ids else ids


def life_attempts(job_ids: list[str], by_job: dict[str, list[gp.Attempt]]) -> list[gp.Attempt]:
    """Every start of every job of the run, in time order (unstarted last)."""
    tries = [a for j in job_ids for a in by_job.get(j, [])]
    return sorted(tries, key=lambda a: (a.start is None, a.start or a.submit or 0.0))


def point_name(p: dict[str, Any], i: int, points: list[dict[str, Any]] | None = None) -> str:
    """A sweep point's name: its swept values (the overrides that differ
    between the manifest's ``points``), else its number. No spaces: a column."""
    from launcher.views.planreport import swept_keys

    overrides = [str(o) for o in p.get("overrides") or []]
    others = [[str(o) for o in q.get("overrides") or []] for q in (points or [p]) if isinstance(q, dict)]
    if not overrides or len(others) < 2:
        return str(p.get("point", i))
    values = dict(o.partition("=")[::2] for o in overrides)
    return ",".join(f"{k}={values[k]}" for k in swept_keys(others) if k in values) or str(p.get("point", i))


def program_of(cfg: dict[str, Any]) -> str:
    """What the run runs: a script or module with its arguments, a Hydra
    point (its app's overrides are the sweep row's name), else the job kind."""
    job = cfg.get("job") or {}
    if job.get("kind") != "script":
        return str(job.get("kind") or "")
    script = str(job.get("script") or "")
    if script.endswith(HYDRA_TASK):
        return "hydra app"
    name = Path(script).name if script else f"-m {job.get('module', '')}"
    return " ".join([name, *(str(a) for a in job.get("args") or [])])


def _total_steps(cfg: dict[str, Any], last: dict[str, Any]) -> int | None:
    job, train = cfg.get("job") or {}, cfg.get("train") or {}
    if job.get("kind") == "script":
        total = int(job.get("total_steps") or 0) or int(last.get("total") or 0)
        return total or None
    if job.get("kind", "pretrain") in TRAINER_KINDS:
        return int(train.get("steps") or 0) or None
    return None


def _tokens(cfg: dict[str, Any], plan: dict[str, Any], step: int | None) -> float | None:
    """Tokens trained: the trainer's steps x global batch x sequence length."""
    if step is None or (cfg.get("job") or {}).get("kind", "pretrain") not in TRAINER_KINDS:
        return None
    gbs = int(plan.get("global_batch_size", 0) or (cfg.get("train") or {}).get("global_batch_size", 0) or 0)
    seq = int((cfg.get("model") or {}).get("seq_len", 0) or 0)
    return float(step * gbs * seq) if gbs and seq else None


def life_goodput(
    run_dir: str | Path,
    job_ids: list[str],
    tries: list[gp.Attempt],
    now: float,
    *,
    write: bool = True,
    cache: dict | None = None,
) -> tuple[dict[str, Any], str]:
    """The run's goodput over every job (``tries``: all their starts) and
    what went wrong writing it. A final one is read back (goodput.json, or
    ``cache``: the web page's memory, it never writes) only when it covers
    the same jobs and sacct recorded its end (the batch script's own write
    ends a second before Slurm's End: recomputed once from sacct)."""
    key = (str(run_dir), tuple(job_ids))
    if cache is not None and key in cache:
        return cache[key], ""
    old = gp.read(run_dir)
    note = ""
    ended = bool(tries) and tries[-1].state in gp.ENDED
    if (
        ended
        and isinstance(old, dict)
        and old.get("final")
        and old.get("job_ids") == job_ids
        and old.get("finalised_by") != "batch script"
    ):
        g = old
    else:
        g = gp.compute(run_dir, tries, now=now)
        g["job_ids"] = list(job_ids)
        if write:
            try:
                gp.write(run_dir, g)
            except OSError as e:
                note = f"goodput.json not written: {e}"
    if cache is not None and g.get("final"):
        cache[key] = g
    return g, note


# result.json's status -> the state a Slurm attempt would have had.
_LOCAL_STATES = {"completed": "COMPLETED", "failed": "FAILED", "preempted": "CANCELLED"}


def local_goodput(
    run_dir: str | Path, plan: dict[str, Any], now: float | None = None
) -> dict[str, Any] | None:
    """A local run's goodput from its own records (no sacct): one
    allocation from spec.json's write (the launch) to result.json's (the
    end; still running without one), its GPUs the plan's ranks on CUDA (0
    on CPU: the buckets then count wall seconds only). None before any
    record."""
    now = time.time() if now is None else now
    run_dir = Path(run_dir)
    recs = gp.read_records(run_dir)
    if not recs:
        return None
    first = recs[0]
    start = float(first["time"]) - float(first.get("step_time_s", 0.0))
    with contextlib.suppress(OSError):  # the launch: spec.json is written just before the ranks start
        start = min(start, (run_dir / SPEC_FILE).stat().st_mtime)
    result = run_dir / RESULT_FILE
    try:
        status = json.loads(result.read_text()).get("status", "")
        end: float | None = max(result.stat().st_mtime, float(recs[-1]["time"]))
    except (OSError, ValueError, AttributeError):
        status, end = "", None
    gpus = int(plan.get("world_size", 0) or 0) if plan.get("device") == "cuda" else 0
    state = _LOCAL_STATES.get(str(status), "RUNNING" if end is None else "FAILED")
    attempt = gp.Attempt("", state, None, start, end, int(plan.get("nodes", 1) or 1), gpus)
    g = gp.compute(run_dir, [attempt], now=now, records=recs)
    g["job_id"] = None
    return g


def write_goodput(run_dir: str | Path, g: dict[str, Any]) -> str:
    """goodput.json written; what went wrong ("" when nothing)."""
    try:
        gp.write(run_dir, g)
    except OSError as e:
        return f"goodput.json not written: {e}"
    return ""


def write_local_goodput(run_dir: str | Path) -> dict[str, Any] | None:
    """A local run's goodput.json at its end (the local launcher's part of
    what the batch script's teardown does for a Slurm job); None: no record."""
    spec = _json(Path(run_dir) / SPEC_FILE)
    plan = (spec.get("plan") or {}) if isinstance(spec, dict) else {}
    g = local_goodput(run_dir, plan)
    if g is not None:
        write_goodput(run_dir, g)
    return g


def _describe(s: RunSummary, cfg: dict[str, Any], plan: dict[str, Any], run_dir: Path) -> None:
    """What the run is and how far it got (spec.json, metrics.jsonl's last step)."""
    job = cfg.get("job") or {}
    s.kind = str(job.get("kind") or "")
    s.program = program_of(cfg)
    s.model = None if s.kind == "script" else (str((cfg.get("model") or {}).get("name") or "") or None)
    last = last_step_record(run_dir / METRICS_FILE)
    if last:
        s.last_step = int(last["step"])
        s.loss = float(last["loss"]) if last.get("loss") is not None else None  # null: none printed
        tps = last.get("tokens_per_s")
        s.tokens_per_s = float(tps) if isinstance(tps, (int, float)) else None
    s.total_steps = _total_steps(cfg, last)
    s.tokens = _tokens(cfg, plan, s.last_step)


def _account(s: RunSummary, g: dict[str, Any]) -> None:
    """The figures every view shows, from the one goodput computation."""
    s.goodput, s.final = g, bool(g.get("final"))
    s.restarts = int(g["restarts"])
    s.recoveries = int(g.get("in_process_recoveries") or 0)
    s.redone_steps = int(g["steps"]["redone"])
    s.gpu_s = float(g["allocated_gpu_s"])
    s.ettr = g.get("ettr")
    s.degraded_share = float(g.get("degraded_share") or 0.0)
    s.gpus = int(g.get("gpus") or 0)


def summarize(
    run_dir: str | Path,
    by_job: dict[str, list[gp.Attempt]],
    *,
    job_id: str | None = None,
    now: float | None = None,
    write: bool = True,
    cache: dict | None = None,
) -> RunSummary:
    """The run's one record: ``by_job`` is sacct's starts by job id (one
    ``sacct`` call for every job of every run shown: :func:`gp.attempts_from`
    of :func:`launcher.slurm.cluster.accounting`); ``job_id``: a sweep
    point's id when its run dir has no job record. Writes goodput.json
    unless ``write`` is false."""
    now = time.time() if now is None else now
    run_dir = Path(run_dir)
    spec = _json(run_dir / SPEC_FILE)
    spec = spec if isinstance(spec, dict) else {}
    cfg, plan = spec.get("cfg") or {}, spec.get("plan") or {}
    s = RunSummary(str(run_dir), life_job_ids(run_dir, job_id))
    _describe(s, cfg, plan, run_dir)
    s.faults = gp._fault_count(run_dir)
    tries = life_attempts(s.job_ids, by_job)
    if not s.job_ids:
        if is_local(run_dir):  # no Slurm job: the lock and result.json say
            s.state = local_state(run_dir).state
            if (g := local_goodput(run_dir, plan, now)) is not None:
                _account(s, g)
                if write:
                    s.note = write_goodput(run_dir, g)
        else:
            s.state = "NOT SUBMITTED"
        return s
    if not tries:
        return s  # sacct does not list the job (yet): UNKNOWN
    last = tries[-1]
    s.state, s.nodes = last.state, last.nodes
    started = [a for a in tries if a.start is not None]
    s.elapsed_s = sum((a.end or now) - float(a.start or now) for a in started) if started else None
    g, s.note = life_goodput(run_dir, s.job_ids, tries, now, write=write, cache=cache)
    _account(s, g)
    return s


def fmt_duration(seconds: float | None) -> str:
    """sacct's Elapsed shape (``[D-]HH:MM:SS``), ``-`` when unknown."""
    if seconds is None:
        return "-"
    sec = int(max(0.0, seconds))
    days, sec = divmod(sec, 86400)
    text = f"{sec // 3600:02d}:{sec % 3600 // 60:02d}:{sec % 60:02d}"
    return f"{days}-{text}" if days else text
