"""One allocation's timeline, bucket by bucket: its records split at each
start of the training (:func:`split_starts`), each second of it placed in
one goodput bucket (:func:`segment`); launcher/views/goodput.py adds the
allocations up.

An in-process recovery (launcher.in_process_recovery: the survivors keep
their processes, an ``in_process_resume`` event at the step they rolled
back to, with the fault's time) is no new start: the step in flight at the
fault is hang_restart, the fault .. the first resumed step ``recovery``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from launcher.config.goodputfile import BUCKETS
from launcher.config.scriptjob import PROGRAM_EXIT, PROGRAM_START


@dataclass
class Attempt:
    """One run (start) of a Slurm job, from one sacct line."""

    job_id: str
    state: str
    submit: float | None
    start: float | None
    end: float | None
    nodes: int
    gpus: int
    node_list: str = ""
    reason: str = ""
    partition: str = ""
    qos: str = ""
    user: str = ""
    account: str = ""
    exit_code: str = ""


@dataclass
class Segment:
    """One allocation, bucket by bucket (wall seconds)."""

    job_id: str
    state: str
    start: float
    end: float
    gpus: int
    queue_wait_s: float
    start_step: int = 0
    last_step: int = 0
    redone_steps: int = 0
    starts: int = 0  # starts of the training in this allocation (restarts inside it + 1)
    recoveries: int = 0  # in-process recoveries (no new start: the survivors kept their processes)
    buckets_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(BUCKETS, 0.0))


# The record an in-process recovery logs before its first resumed step
# (train/loop/resilient.py): step (rolled back to), fault_time.
IN_PROCESS_RESUME = "in_process_resume"
_STARTS = ("resume", "shrunk_layout", IN_PROCESS_RESUME)


def split_starts(recs: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """An allocation's records split at each start of the training (a
    restart inside the allocation, launcher/selfheal/supervisor.py): a new start
    begins at a ``resume``, ``shrunk_layout`` or ``in_process_resume`` event
    (the first records of a restarted process or a recovered one) after progress, at a ``program_start`` (job=script:
    launcher/taskwrap/wrapper.py) after progress or another one, or at a step
    record whose step is not above the one before (restarted without a
    checkpoint)."""
    starts: list[list[dict[str, Any]]] = [[]]
    prev_step: int | None = None
    progressed = began = False
    for r in recs:
        ev = r.get("event")
        is_step = ev is None and "loss" in r and "step" in r
        if (
            (ev in _STARTS and progressed)
            or (ev == PROGRAM_START and (progressed or began))
            or (is_step and prev_step is not None and int(r["step"]) <= prev_step)
        ):
            starts.append([])
            progressed = began = False
        began = began or ev == PROGRAM_START
        if ev in (*_STARTS, PROGRAM_START):
            prev_step = None  # a new start: its steps may begin again at 1 (no checkpoint yet)
        elif is_step:
            prev_step = int(r["step"])
        progressed = progressed or is_step or ev in ("checkpoint", "preempted")
        starts[-1].append(r)
    return starts


class _Timeline:
    """One allocation's buckets, in allocation-seconds: a wall second counts
    in full where every allocated GPU trains (or waits for the whole run);
    where the run trains on fewer nodes than it holds (a shrink after a
    fault with no spare, a spare waiting), the unused share of that second
    is ``degraded``, never productive. Buckets sum to the wall time."""

    def __init__(self, b: dict[str, float]) -> None:
        self.b = b
        self.used = 1.0  # share of the allocation's GPUs the current start trains on

    def add(self, bucket: str, dt: float) -> None:
        self.b[bucket] += dt * self.used
        self.b["degraded"] += dt * (1.0 - self.used)


def _used_share(part: list[dict[str, Any]], train_nodes: int, alloc_nodes: int) -> float:
    """The share of an allocation's nodes one start trains on: a
    ``shrunk_layout`` event's nodes, else the planned nodes."""
    shrunk = [r for r in part if r.get("event") == "shrunk_layout"]
    nodes = int(shrunk[-1].get("nodes") or train_nodes) if shrunk else train_nodes
    if alloc_nodes <= 0 or nodes <= 0:
        return 1.0
    return min(1.0, nodes / alloc_nodes)


def _step_walls(part: list[dict[str, Any]]) -> dict[int, float]:
    """Each step record's wall seconds on the loop's clock (from the record
    before it, a save left out; the first of a start: its own step time), so
    that redone steps are measured as the span they sit in is."""
    out: dict[int, float] = {}
    prev: float | None = None
    for r in part:
        if r.get("event") == "checkpoint":
            prev = float(r["time"])
        elif r.get("event") is None and "loss" in r and "step" in r:
            out[id(r)] = float(r.get("step_time_s", 0.0)) if prev is None else float(r["time"]) - prev
            prev = float(r["time"])
    return out


def _steps_of(tl: _Timeline, seg: Segment, part: list[dict[str, Any]], t: float, lead: str, begin_step: int,
              high_water: int) -> tuple[float, int]:  # fmt: skip
    """A start's steps from ``t``: (end of the loop, highest step reached)."""
    steps = [r for r in part if r.get("event") is None and "loss" in r and "step" in r]
    ckpts = [r for r in part if r.get("event") == "checkpoint"]
    stops = [r for r in part if r.get("event") == "preempted"]
    first_begin = max(t, float(steps[0]["time"]) - float(steps[0].get("step_time_s", 0.0)))
    tl.add(lead, first_begin - t)
    loop_end = max(first_begin, max(float(r["time"]) for r in [*steps, *ckpts]))
    stall = min(sum(float(r.get("save_s", 0.0)) for r in ckpts), loop_end - first_begin)
    step_time = loop_end - first_begin - stall
    tl.add("checkpoint_stall", stall)
    reached = max(int(r["step"]) for r in [*steps, *ckpts, *stops])
    n = max(0, reached - begin_step)
    redone = max(0, min(reached, high_water) - begin_step)
    wall = _step_walls(part)
    redone_logged = [r for r in steps if begin_step < int(r["step"]) <= high_water]
    if redone and len({int(r["step"]) for r in redone_logged}) == redone:
        redone_s = min(step_time, sum(wall[id(r)] for r in redone_logged))
    else:
        redone_s = step_time * redone / n if n else 0.0
    tl.add("redone", redone_s)
    tl.add("productive", step_time - redone_s)
    seg.redone_steps += redone
    return loop_end, reached


def segment(
    a: Attempt, recs: list[dict[str, Any]], high_water: int, now: float, last: bool, train_nodes: int = 0
) -> Segment:
    start = float(now if a.start is None else a.start)
    running = a.end is None
    end = now if a.end is None else float(a.end)
    queue_wait = max(0.0, start - a.submit) if a.submit else 0.0
    seg = Segment(a.job_id, a.state, start, end, a.gpus, queue_wait)
    tl = _Timeline(seg.buckets_s)
    seg.start_step = seg.last_step = high_water
    t = start  # the timeline's cursor: every second up to it is in a bucket
    stepped = recovering = False
    parts = split_starts(recs)
    for i, part in enumerate(parts):
        # Before the first step of a start: start-up in the allocation's
        # first start; lost to the restart in a later one.
        lead = "startup" if i == 0 else "hang_restart"
        has_steps = any(r.get("event") is None and "loss" in r and "step" in r for r in part)
        resume = next((r for r in part if r.get("event") == "resume"), None)
        recovered = next((r for r in part if r.get("event") == IN_PROCESS_RESUME), None)
        ckpts = [r for r in part if r.get("event") == "checkpoint"]
        stops = [r for r in part if r.get("event") == "preempted"]
        program = next((r for r in part if r.get("event") == PROGRAM_START), None)
        if not has_steps and not resume and not recovered and not ckpts and program is None:
            continue
        if recovered is not None and i > 0:
            seg.recoveries += 1
            lead, t = "recovery", _recovery_begins(tl, recovered, t)
            resume = recovered
        else:
            seg.starts += 1
        tl.used = _used_share(part, train_nodes or a.nodes, a.nodes)
        # No resume record: a program that resumed itself (job=script) starts
        # after its own checkpoint, its first step says where (1: from scratch).
        first = next(
            (int(r["step"]) for r in part if r.get("event") is None and "loss" in r and "step" in r), 1
        )
        begin_step = int(resume["step"]) if resume else max(0, first - 1)
        if i == 0:
            seg.start_step = begin_step
        if resume is not None and resume is not recovered:
            restore_s = float(resume.get("restore_s", 0.0))
            t_restore = max(t, float(resume["time"]) - restore_s)
            tl.add(lead, t_restore - t)
            t_resumed = max(t_restore, float(resume["time"]))
            tl.add("restore", t_resumed - t_restore)
            t = t_resumed
        if has_steps:
            stepped = True
            loop_end, reached = _steps_of(tl, seg, part, t, lead, begin_step, high_water)
        elif program is not None and not resume and not ckpts:
            # A program that reports no step: its run time is the work (wall
            # clock; redone work cannot be told). Without its exit record (a
            # task killed with it) the span ends at its start: the rest is lost.
            exited = next((r for r in part if r.get("event") == PROGRAM_EXIT), None)
            begin = max(t, float(program["time"]))
            tl.add(lead, begin - t)
            if exited is not None:
                loop_end = max(begin, float(exited["time"]))
            elif running and last and i == len(parts) - 1:
                loop_end = max(begin, end)
            else:
                loop_end = begin
            tl.add("productive", loop_end - begin)
            reached = begin_step
        else:
            # Resumed (or only saved) but no step logged yet.
            reached = max([begin_step, *(int(r["step"]) for r in [*ckpts, *stops])])
            loop_end = max([t, *(float(r["time"]) for r in ckpts)])
            tl.add("checkpoint_stall", loop_end - t)
        high_water = max(high_water, reached)
        recovering = lead == "recovery" and not has_steps
        seg.last_step = max(seg.last_step, reached)
        t = loop_end
    tl.add(_tail_bucket(a.state, t == start, running, last, stepped, recovering), max(0.0, end - t))
    return seg


def _tail_bucket(state: str, silent: bool, running: bool, last: bool, stepped: bool, recovering: bool) -> str:
    """Where an allocation's seconds after its last record go."""
    if silent:
        # Nothing logged: it never trained (start-up, then a failure or a hang).
        return "startup" if state == "COMPLETED" or running else "hang_restart"
    if state == "COMPLETED" and last:
        return "idle_end"
    if running and last and recovering:
        return "recovery"  # recovering in process: no step since
    if running and last:
        return "productive" if stepped else "startup"  # the step in flight (or start-up)
    return "hang_restart"  # stop after a signal, a failure, a hang until killed


def _recovery_begins(tl: _Timeline, rec: dict[str, Any], t: float) -> float:
    """An in-process recovery's start: the step in flight at the fault (from
    ``t``, the last progress) is lost to it (hang_restart); the fault, where
    ``recovery`` begins."""
    fault_t = max(t, float(rec.get("fault_time", t)))
    tl.add("hang_restart", fault_t - t)
    return fault_t
