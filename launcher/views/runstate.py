"""A run's or a sweep's state as data, one row per job, for ``meshrun
status`` / ``logs`` / ``cancel`` (the command: launcher/commands/status.py)
and launcher/api.py.

A run is named by its run id (the directory is the RUN DIR column). A
local run (cluster=local) has no job: its state is RUNNING while its
launcher holds the run dir's lock, else how result.json says it ended; its
output is logs/rank<N>.log; cancel signals its launcher
(launcher/views/localrun.py).

Every figure (state, elapsed, restarts, faults, redone steps, last step,
loss, tokens/s, GPU-hours, ETTR) is the run's one record over every job of
its run dir (launcher/views/runsummary.py: what ``meshrun fleet``, the page
and goodput.json say too), from one sacct call; goodput.json is refreshed
on each call (``~``: not final yet). A run whose checkpoint
saves failed gets a line under the table (from the trainer's
``checkpoint_status.json``): how many failed, in a row, the newest committed
step and the last failure's cause.
"""

from __future__ import annotations

import json
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from launcher.config.health import fault_summary, read_faults
from launcher.config.runfiles import (
    CHECKPOINT_STATUS_FILE,
    MANIFEST_FILE,
    METRICS_FILE,
    PIPELINE_FILE,
    SLURM_DIR,
    SPEC_FILE,
)
from launcher.config.runid import read_run_id
from launcher.config.runrecord import read_record
from launcher.config.spec import saved_login
from launcher.slurm.cluster import accounting, cancel, jobs
from launcher.slurm.depend import FAILED
from launcher.slurm.submit import read_job_id
from launcher.views.goodput import attempts_from
from launcher.views.localrun import cancel_local, is_local, local_state, rank_logs
from launcher.views.ranklogs import rank_log
from launcher.views.runforecast import RunForecast, run_forecast
from launcher.views.runsummary import RunSummary, fmt_duration, life_job_ids, point_name, summarize

MANIFEST = MANIFEST_FILE
# sacct states after which a job does not run again (a PREEMPTED one is requeued).
FINISHED = frozenset(FAILED - {"PREEMPTED"} | {"COMPLETED"})


@dataclass
class Row:
    point: str
    run_dir: str
    job_id: str | None
    state: str = "-"
    elapsed: str = "-"
    nodes: str = "-"
    restarts: str = "-"
    step: str = "-"
    loss: str = "-"
    tokens_per_s: str = "-"
    ettr: str = "-"  # goodput: productive / allocated GPU-seconds (goodput.json)
    program: str = "-"  # a script's name and arguments, or the job kind
    total: str = "-"  # steps to do, "-" when unknown (a script's without job.total_steps)
    faults: str = "0"
    redone: str = "-"  # steps run again after a failure or a preemption
    gpu_hours: str = "-"  # GPU-seconds of every job of the run / 3600
    summary: RunSummary | None = None  # the run's one record (launcher/views/runsummary.py)
    checkpoint: str = ""  # a line on failed saves, or ""
    forecast: RunForecast | None = None  # P50 / P90 finish (launcher/views/runforecast.py)


def runs_of(path: Path) -> list[tuple[str, str, str | None]]:
    """(point, run dir, job id) for a sweep dir (manifest), a Hydra multirun
    dir (its manifest, else every run dir in it) or one run dir."""
    pipeline = path / PIPELINE_FILE
    if pipeline.exists():  # meshrun pipeline: one row per stage, named by the stage
        data = json.loads(pipeline.read_text())
        return [(s["stage"], s["run_dir"], s.get("job_id")) for s in data["stages"]]
    manifest = path / MANIFEST
    if manifest.exists():
        data = json.loads(manifest.read_text())
        return [
            (point_name(p, i, data["points"]), p["run_dir"], p.get("job_id") or read_job_id(p["run_dir"]))
            for i, p in enumerate(data["points"])
            if p.get("run_dir")
        ]
    if (path / SPEC_FILE).exists():
        return [(read_run_id(path) or path.name, str(path), read_job_id(path))]
    # A multirun dir whose manifest is not written (yet): its point dirs.
    subdirs = path.iterdir() if path.is_dir() else ()
    points = sorted((d for d in subdirs if (d / SPEC_FILE).exists()), key=lambda d: (len(d.name), d.name))
    if points:
        return [(read_run_id(d) or d.name, str(d), read_job_id(d)) for d in points]
    if (path / SLURM_DIR).is_dir():
        return [(read_run_id(path) or path.name, str(path), read_job_id(path))]
    raise ValueError(f"{path} is neither a run dir (spec.json, slurm/) nor a sweep dir ({MANIFEST})")


def last_metrics(run_dir: str) -> tuple[str, str, str]:
    """(step, loss, tokens/s) of the run's last logged step, '-' when none."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return "-", "-", "-"
    step, loss, tps = "-", "-", "-"
    with open(path) as f:
        for line in deque(f, maxlen=50):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line being written
            if "loss" in rec and "step" in rec:
                # loss null: a job=script step line whose program printed none
                step, loss = str(rec["step"]), f"{rec['loss']:.4f}" if rec["loss"] is not None else "-"
                tps = f"{rec['tokens_per_s']:.0f}" if "tokens_per_s" in rec else "-"
    return step, loss, tps


def checkpoint_problems(run_dir: str) -> str:
    """One line on the run's failed checkpoint saves ("" when none, or no
    checkpoint_status.json yet)."""
    try:
        data = json.loads((Path(run_dir) / CHECKPOINT_STATUS_FILE).read_text())
    except (OSError, ValueError):
        return ""
    failed = int(data.get("failed_saves") or 0)
    if not failed:
        return ""
    last = data.get("last_failure") or {}
    committed = data.get("committed_step")
    return (
        f"{failed} checkpoint save(s) FAILED ({data.get('failed_in_a_row', '?')} in a row, the run stops at "
        f"{data.get('max_failed_saves', '?')}); newest committed step in this run: "
        f"{committed if committed is not None else 'none'}; last failure, step {last.get('step')}: "
        f"{str(last.get('error', ''))[:300]}"
    )


def by_login(job_ids: dict[str, list[str]]) -> dict[str, list[str]]:
    """The job ids of each run dir, grouped by where Slurm is asked about
    them: its ``cluster.login`` ("" this machine), so each cluster gets one call."""
    out: dict[str, set[str]] = {}
    for run_dir, ids in job_ids.items():
        out.setdefault(saved_login(run_dir), set()).update(ids)
    return {login: sorted(ids) for login, ids in sorted(out.items())}


def table(path: Path, now: float | None = None) -> list[Row]:
    """One row per run: every figure from its one record (runsummary.py),
    one sacct call for every job of every run (per cluster), goodput.json refreshed."""
    entries = runs_of(path)
    lives = {d: life_job_ids(d, j) for _, d, j in entries}
    by_job = attempts_from(
        [row for login, ids in by_login(lives).items() for row in accounting(ids, login=login)]
    )
    rows = []
    for point, run_dir, job_id in entries:
        s = summarize(run_dir, by_job, job_id=job_id, now=now)
        row = Row(point, run_dir, s.job_id, state=s.state, summary=s)
        if s.job_id and s.state == "UNKNOWN":
            row.state = "-"  # sacct does not list it (yet)
        row.elapsed, row.nodes = fmt_duration(s.elapsed_s), str(s.nodes or "-")
        if not s.job_ids and is_local(run_dir):
            row.elapsed = local_state(run_dir).elapsed
        row.restarts = "-" if s.restarts is None else str(s.restarts)
        row.step = "-" if s.last_step is None else str(s.last_step)
        row.total = "-" if s.total_steps is None else str(s.total_steps)
        row.loss = "-" if s.loss is None else f"{s.loss:.4f}"
        row.tokens_per_s = "-" if s.tokens_per_s is None else f"{s.tokens_per_s:.0f}"
        row.faults, row.program = str(s.faults), s.program or "-"
        row.redone = "-" if s.redone_steps is None else str(s.redone_steps)
        row.gpu_hours = "-" if s.gpu_s is None else f"{s.gpu_s / 3600.0:.3f}"
        row.checkpoint = checkpoint_problems(run_dir)
        running = row.state in ("RUNNING", "COMPLETING", "PENDING", "REQUEUED", "SUSPENDED")
        # A stopped local run (no job, no launcher) has not finished: its steps left are forecast.
        done = row.state in FINISHED or row.state.startswith(("COMPLETED", "FAILED", "CANCELLED"))
        row.forecast = run_forecast(run_dir, finished=done, running=running)
        if s.ettr is not None:
            row.ettr = f"{100 * s.ettr:.1f}%" + ("" if s.final else "~")
            if s.degraded_share >= 0.005:  # held, not trained on (shrink, spares)
                row.ettr += f" ({100 * s.degraded_share:.0f}% degraded)"
        rows.append(row)
    return rows


def format_table(rows: list[Row]) -> str:
    head = ["RUN", "PROGRAM", "JOB", "STATE", "ELAPSED", "NODES", "RESTARTS", "FAULTS", "REDONE", "STEP"]
    head += ["LOSS", "TOK/S", "GPU-H", "ETTR", "RUN DIR"]
    body = [
        [r.point, r.program, r.job_id or "-", r.state, r.elapsed, r.nodes, r.restarts, r.faults, r.redone]
        + [r.step if r.total == "-" else f"{r.step}/{r.total}", r.loss, r.tokens_per_s, r.gpu_hours]
        + [r.ettr, r.run_dir]
        for r in rows
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=False)]
    lines = [
        "  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=False)).rstrip()
        for line in [head, *body]
    ]
    lines += [f"{r.point}: {r.checkpoint}" for r in rows if r.checkpoint]
    return "\n".join(lines)


def forecast_lines(rows: list[Row]) -> list[str]:
    """One line per run with measured steps: P50 / P90 to finish (runforecast.py)."""
    return [f"{r.point}: {r.forecast.line()}" for r in rows if r.forecast]


def fault_lines(rows: list[Row]) -> list[str]:
    """One line per run with faults (<run_dir>/faults.jsonl): counts by cause,
    restarts, requeues, seconds lost, the last fault; restarts and steps
    redone are the run's one record's (the table's, goodput.json's)."""
    out = []
    for r in rows:
        s = fault_summary(read_faults(r.run_dir))
        if not s["faults"]:
            continue
        causes = ", ".join(f"{c} {n}" for c, n in sorted(s["by_cause"].items()))
        # A row of the run's record says its counts; a bare Row (no record) the file's own.
        faults, restarts, redone = (
            (r.faults, r.restarts, r.redone) if r.summary else (s["faults"], s["restarts"], s["steps_redone"])
        )
        recovered = (
            r.summary.recoveries if r.summary and r.summary.recoveries is not None else s["in_process"]
        )
        inproc = f", in-process recoveries {recovered}" if recovered else ""
        out.append(
            f"{r.point}: faults {faults} ({causes}); restarts {restarts}{inproc}, requeues {s['requeues']}; "
            f"lost {s['seconds_lost']:.1f} s, {redone} step(s) redone; last: {s['last']}"
            + _last_recovery(s["per_fault"])
        )
    return out


def _last_recovery(per_fault: list[dict]) -> str:
    """The newest come-back when it was in process: how, its seconds, its steps redone."""
    if not per_fault or per_fault[-1].get("recovery") != "in_process":
        return ""
    f = per_fault[-1]
    return (
        f"; recovered in process from {f.get('state_from') or 'peer memory'}: "
        f"{float(f.get('seconds_lost') or 0):.1f} s to step {f.get('first_step')}, "
        f"{f.get('steps_redone')} step(s) redone"
    )


def ended(row: Row) -> bool:
    """The row's job will not run again (a local run: its launcher is gone)."""
    return row.state in FINISHED or (row.job_id is None and row.state != "RUNNING")


def log_file(run_dir: str, job_id: str | None, rank: int = 0) -> tuple[Path | None, list[str]]:
    """(the file holding global rank ``rank``'s output or None, the other
    local ranks' log names): a Slurm job's task file, a local run's
    logs/rank<N>.log; under torchrun the node's that hosts it
    (launcher/views/ranklogs.py)."""
    found = rank_log(run_dir, job_id, rank).path
    if job_id:
        return found, []
    return found, [p.stem for p in rank_logs(run_dir) if p != found]


def tail(path: Path, lines: int) -> str:
    with open(path, errors="replace") as f:
        return "".join(deque(f, maxlen=lines))


def _run_of(after: dict) -> str:
    """' (<run dir>)' of a dependency, '' when only its job id is known (not 'job 14 (14)')."""
    run = after.get("run_dir") or ("" if after["after"] == after["job_id"] else after["after"])
    return f" ({run})" if run else ""


def dependency_lines(rows: list[Row]) -> list[str]:
    """A run waiting for others (launcher.after, a pipeline stage): what it
    waits for, and, when Slurm cancelled it, which dependency failed and how."""
    waits = {}
    for r in rows:
        after = ((read_record(r.run_dir) or {}).get("parents") or {}).get("after") or []
        if after and r.state in ("PENDING", "CANCELLED", "NOT SUBMITTED", "-"):
            waits[r.point] = (r, after)
    if not waits:
        return []
    # A run's dependencies are jobs of its own cluster.
    wanted = {r.run_dir: [str(a["job_id"]) for a in after] for r, after in waits.values()}
    states = {k: v for login, ids in by_login(wanted).items() for k, v in jobs(ids, login=login).items()}
    out = []
    for point, (r, after) in waits.items():
        seen = [(a, states[a["job_id"]].state if a["job_id"] in states else "unknown") for a in after]
        failed = [
            f"job {a['job_id']}{_run_of(a)} ended {st}"
            for a, st in seen
            if st in FINISHED and st != "COMPLETED"
        ]
        if failed and r.state == "CANCELLED":
            out.append(f"{point}: cancelled by Slurm: a run it depends on failed: {'; '.join(failed)}")
        elif failed:
            out.append(f"{point}: will not start: {'; '.join(failed)}")
        else:
            out.append(f"{point}: waits for " + ", ".join(f"job {a['job_id']} ({st})" for a, st in seen))
    return out


def cancel_counts(path: Path) -> tuple[int, int]:
    """(jobs cancelled or local runs stopped, local runs that could not be),
    each said on its own line; an ended Slurm job is neither."""
    entries = runs_of(path)
    wanted = {d: [j] for _, d, j in entries if j}
    records = {k: v for login, ids in by_login(wanted).items() for k, v in jobs(ids, login=login).items()}
    cancelled = refused = 0
    for point, run_dir, job_id in entries:
        if not job_id:
            ok, msg = cancel_local(run_dir)
            print(f"meshrun: {msg}", file=sys.stdout if ok else sys.stderr)
            cancelled, refused = cancelled + ok, refused + (not ok)
            continue
        rec = records.get(job_id)
        if rec and rec.state in FINISHED:
            print(f"meshrun: {point} (job {job_id}) already {rec.state}; nothing to cancel")
            continue
        cancel(job_id, login=saved_login(run_dir))
        cancelled += 1
        print(f"meshrun: cancelled {point} (job {job_id})")
    return cancelled, refused
