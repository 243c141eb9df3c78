"""Goodput of a run: where every allocated GPU-second went.

Slurm's accounting (one ``sacct`` line per run of the job: a requeued job has
one per start, :func:`launcher.slurm.cluster.accounting`) gives the
allocations; the run's own ``metrics.jsonl`` (step records, ``resume`` with
``restore_s``, ``checkpoint`` with ``save_s``, ``preempted``) places each
second of each allocation on one timeline:

    allocation start .. restore begins        startup   (imports, build, init)
    restore begins .. resume event            restore   (restore_s)
    resume event .. first step begins         startup
    first step .. last step / checkpoint      productive + redone + checkpoint_stall
    last progress .. allocation end           idle_end (the run completed) or
                                              hang_restart (preempted, failed, hung)

An in-process recovery (launcher.in_process_recovery) is no new start: the
fault .. its first resumed step is ``recovery`` (launcher/views/goodputtimeline.py
places each second of an allocation).

A job=script program that reports no step is placed by its wrapper's
``program_start`` / ``program_exit`` records: start-up before it starts,
its run time productive (wall clock: redone work cannot be told), each
start after the first a restart.

``redone`` is the step time of steps at or below the highest step an
earlier allocation had already reached (work lost to a failure or a
preemption after the last checkpoint); ``productive`` the rest.
GPU-seconds are wall seconds x the allocation's GPUs (AllocTRES gres/gpu).
ETTR = productive / allocated. Queue wait (submit to start, for each start)
is wall time only: no GPU is allocated then.

``<run_dir>/goodput.json`` (:func:`write`) is refreshed by ``meshrun fleet``
while the job runs and marked ``final`` once Slurm says it ended;
``meshrun fleet --prom FILE`` writes every run's figures in Prometheus' text
format (:func:`prom_text`, for node_exporter's textfile collector).
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from launcher.config import health
from launcher.config.goodputfile import BUCKETS, HELP, SERIES, samples
from launcher.config.runfiles import (
    FAILURES_FILE,
    GOODPUT_FILE,
    METRICS_FILE,
    REQUEUES_FILE,
    SPEC_FILE,
)
from launcher.views.goodputtimeline import Attempt, segment

# States after which a run of the job does not continue.
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL", "DEADLINE")
CLOCK_SLACK_S = 1.0  # sacct times are whole seconds


def _epoch(value: str) -> float | None:
    return float(value) if value and value.isdigit() and int(value) > 0 else None


def gpus_of(tres: str) -> int:
    """GPUs in a TRES string (``gres/gpu=8`` or ``gres/gpu:h100=8``)."""
    m = re.search(r"gres/gpu(?::[^=,]+)?=(\d+)", tres or "")
    return int(m.group(1)) if m else 0


def attempts_from(rows: list[dict[str, str]]) -> dict[str, list[Attempt]]:
    """sacct rows (:func:`launcher.slurm.cluster.accounting`) by job id, oldest run first."""
    out: dict[str, list[Attempt]] = {}
    for r in rows:
        tres = r.get("AllocTRES") or r.get("ReqTRES", "")
        out.setdefault(r["JobID"], []).append(
            Attempt(
                job_id=r["JobID"],
                state=r["State"].split()[0] if r.get("State") else "UNKNOWN",
                submit=_epoch(r.get("Submit", "")),
                start=_epoch(r.get("Start", "")),
                end=_epoch(r.get("End", "")),
                nodes=int(r["NNodes"]) if r.get("NNodes", "").isdigit() else 0,
                gpus=gpus_of(tres) or gpus_of(r.get("ReqTRES", "")),
                node_list=r.get("NodeList", ""),
                reason=r.get("Reason", ""),
                partition=r.get("Partition", ""),
                qos=r.get("QOS", ""),
                user=r.get("User", ""),
                account=r.get("Account", ""),
                exit_code=r.get("ExitCode", ""),
            )
        )
    return out


# A step line as train/observe/runlog.py writes it (json.dumps of the metrics dict,
# then "time"): its fields goodput needs, read without a full parse.
_STEP_LINE = re.compile(
    r'^\{"step": (\d+), "loss": ([^,]+), .*"step_time_s": ([^,]+), .*"time": ([0-9.e+]+)\}$', re.M
)


def _parse_lines(lines: list[str]) -> list[dict[str, Any]]:
    recs = []
    for line in lines:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written
        if isinstance(rec, dict) and isinstance(rec.get("time"), (int, float)):
            recs.append(rec)
    return recs


def read_records(run_dir: str | Path) -> list[dict[str, Any]]:
    """metrics.jsonl's records that carry a time, in file (= time) order; a
    line being written is skipped. Step lines keep only step, loss,
    step_time_s and time (read by one regex over the file: 200 runs of 500
    steps in well under a second)."""
    path = Path(run_dir) / METRICS_FILE
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return []
    found = _STEP_LINE.findall(text)
    lines = text.splitlines()
    others = [ln for ln in lines if ln and not ln.startswith('{"step": ')]
    if len(found) + len(others) != sum(1 for ln in lines if ln):
        return _parse_lines(lines)  # step lines in another shape: parse each
    try:
        recs = [
            {"step": int(a), "loss": float(b), "step_time_s": float(c), "time": float(d)}
            for a, b, c, d in found
        ]
    except ValueError:
        return _parse_lines(lines)
    if others:
        recs += _parse_lines(others)
        recs.sort(key=lambda r: r["time"])  # appended by one process: file order is time order
    return recs


def _lines(path: Path) -> list[str]:
    try:
        return [x for x in path.read_text().splitlines() if x.strip()]
    except FileNotFoundError:
        return []


def _fault_count(run_dir: Path) -> int:
    """One count per fault: the supervisor's faults.jsonl (one record each)
    where it ran; failures.log (the batch script's lines) otherwise."""
    recs = health.read_faults(run_dir)
    return health.fault_summary(recs)["faults"] if recs else len(_lines(run_dir / FAILURES_FILE))


def _share(gpu_s: float, alloc_gpu_s: float, wall_s: float, alloc_s: float) -> float:
    if alloc_gpu_s > 0:
        return gpu_s / alloc_gpu_s
    return wall_s / alloc_s if alloc_s > 0 else 0.0


def _planned_nodes(run_dir: Path) -> int:
    """The nodes the run's plan trains on (spec.json), 0 when unknown: an
    allocation holding more (spares) or a start on fewer (a shrink) leaves
    the rest ``degraded``."""
    try:
        return int(json.loads((run_dir / SPEC_FILE).read_text())["plan"]["nodes"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def _place(
    recs: list[dict[str, Any]], started: list[Attempt], now: float
) -> tuple[list[list[dict[str, Any]]], int]:
    """Each record to the allocation whose window holds its time; (per allocation, unplaced)."""
    windows = [(float(a.start), now if a.end is None else float(a.end)) for a in started]  # type: ignore[arg-type]
    per: list[list[dict[str, Any]]] = [[] for _ in started]
    unplaced = 0
    for rec in recs:
        t = rec["time"]
        for k, (s, e) in enumerate(windows):
            if s - CLOCK_SLACK_S <= t <= e + CLOCK_SLACK_S:
                per[k].append(rec)
                break
        else:
            unplaced += 1
    return per, unplaced


def compute(
    run_dir: str | Path,
    attempts: list[Attempt],
    *,
    now: float | None = None,
    records: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """goodput.json's content for a run whose job ran as ``attempts`` (sacct, oldest first)."""
    now = time.time() if now is None else now
    run_dir = Path(run_dir)
    recs = read_records(run_dir) if records is None else records
    started = [a for a in attempts if a.start is not None]
    per, unplaced = _place(recs, started, now)
    segments, high_water = [], 0
    train_nodes = _planned_nodes(run_dir)
    for i, a in enumerate(started):
        seg = segment(a, per[i], high_water, now, last=i == len(started) - 1, train_nodes=train_nodes)
        high_water = max(high_water, seg.last_step)
        segments.append(seg)
    pending = [a for a in attempts if a.start is None and a.submit is not None]
    queue_wait = sum(s.queue_wait_s for s in segments) + sum(
        (a.end or now) - float(a.submit or now) for a in pending
    )
    buckets_s = {k: sum(s.buckets_s[k] for s in segments) for k in BUCKETS}
    buckets_gpu_s = {k: sum(s.buckets_s[k] * s.gpus for s in segments) for k in BUCKETS}
    allocated_s = sum(s.end - s.start for s in segments)
    allocated_gpu_s = sum((s.end - s.start) * s.gpus for s in segments)
    last = attempts[-1] if attempts else None
    final = bool(last and last.state in ENDED and last.end)
    requeues = [x.split() for x in _lines(run_dir / REQUEUES_FILE)]
    productive_steps = high_water  # every step up to the highest reached, each counted once
    ettr_base = allocated_gpu_s if allocated_gpu_s > 0 else allocated_s
    ettr_num = buckets_gpu_s["productive"] if allocated_gpu_s > 0 else buckets_s["productive"]
    return {
        "version": 1,
        "run_dir": str(run_dir),
        "job_id": last.job_id if last else None,
        "state": last.state if last else "UNKNOWN",
        "final": final,
        "updated": now,
        "gpus": max((s.gpus for s in segments), default=0),
        "allocations": len(segments),
        # Every start of the training after the first: requeues and restarts
        # inside an allocation alike (an allocation that never trained counts once).
        "restarts": max(0, sum(max(1, s.starts) for s in segments) - 1),
        # In-process recoveries (launcher.in_process_recovery): no restart, the survivors kept going.
        "in_process_recoveries": sum(s.recoveries for s in segments),
        "requeues": {
            "preemptions": sum(1 for r in requeues if len(r) > 2 and r[2] == "preemption"),
            "time_limits": sum(1 for r in requeues if len(r) > 2 and r[2] == "time_limit"),
        },
        "failures": _fault_count(run_dir),
        "queue_wait_s": queue_wait,
        "allocated_s": allocated_s,
        "allocated_gpu_s": allocated_gpu_s,
        "buckets_s": buckets_s,
        "buckets_gpu_s": buckets_gpu_s,
        "ettr": ettr_num / ettr_base if ettr_base > 0 else None,
        # Share of the allocation held but not trained on (shrunk, spares waiting).
        "degraded_share": _share(
            buckets_gpu_s["degraded"], allocated_gpu_s, buckets_s["degraded"], allocated_s
        ),
        "steps": {
            "reached": high_water,
            "productive": productive_steps,
            "redone": sum(s.redone_steps for s in segments),
        },
        "unplaced_records": unplaced,
        "segments": [
            {k: v for k, v in asdict(s).items() if k != "buckets_s"} | {"buckets_s": s.buckets_s}
            for s in segments
        ],
    }


def prom_text(g: dict[str, Any], run: str) -> str:
    """The figures in Prometheus' text exposition format (labels run, job_id)."""

    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    labels = f'run="{esc(run)}",job_id="{esc(str(g.get("job_id") or ""))}"'
    lines: list[str] = []
    for key, extra, value in samples(g):
        name = SERIES[key]
        if not any(x.startswith(f"# TYPE {name} ") for x in lines):
            lines.extend([f"# HELP {name} {HELP[key]}", f"# TYPE {name} gauge"])
        more = "".join(f',{k}="{esc(v)}"' for k, v in extra.items())
        fmt = ".6f" if key == "ettr" else "d" if key in ("redone_steps", "restarts") else ".3f"
        lines.append(f"{name}{{{labels}{more}}} {(int(value) if fmt == 'd' else value):{fmt}}")
    return "\n".join(lines) + "\n"


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write(run_dir: str | Path, g: dict[str, Any]) -> Path:
    """``<run_dir>/goodput.json``, replaced atomically."""
    run_dir = Path(run_dir)
    path = run_dir / GOODPUT_FILE
    _atomic(path, json.dumps(g, separators=(",", ":")) + "\n")
    return path


def read(run_dir: str | Path) -> dict[str, Any] | None:
    """``<run_dir>/goodput.json``, or None when there is none (or it is unreadable)."""
    try:
        g = json.loads((Path(run_dir) / GOODPUT_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return g if isinstance(g, dict) else None
