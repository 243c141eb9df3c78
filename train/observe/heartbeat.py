"""Each rank's progress and stacks for the batch-level supervisor
(``launcher/selfheal/supervisor.py``; file formats in :mod:`launcher.config.health`).

:func:`start` (called by ``python -m train``, train/__main__.py, before torch
is imported) registers :mod:`faulthandler` on :data:`STACK_SIGNAL` into this
rank's stack file and writes the ``startup`` heartbeat; :func:`beat` then
rewrites the heartbeat at each phase change and at the start of each step
(one small file on node-local storage, written and renamed: microseconds).
The node's local rank 0 also runs the node's :class:`NodeWriter`: one file
per node in the run dir, rewritten every second, carrying every local rank's
last beat (the shared file system's load does not grow with ranks per node).
A rank whose heartbeat stops advancing is hung; the supervisor sends
STACK_SIGNAL to the step, reads the stacks, and ends and restarts the step.

Standard library only. Outside a supervised job (local runs, tests that
call ``train.jobs.entry.main`` directly) :func:`beat` does nothing.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import sys
from collections import deque
from typing import IO

from launcher.config.health import (
    ATTEMPT_ENV,
    STACK_SIGNAL,
    NodeWriter,
    read_local_heartbeats,
    stack_path,
    write_heartbeat,
)
from launcher.config.runfiles import STACKS_DIR
from launcher.config.warmspare import incarnation

_run_dir: str | None = None
_rank = 0
_stack_file: IO[str] | None = None
_last: tuple[str, int] = ("startup", 0)  # the last beat's phase and step
# The newest solo probes (train/observe/probe.py): [step, seconds, after_save],
# carried in every heartbeat for the supervisor's straggler watch.
PROBES_KEPT = 16
_probes: deque[list[object]] = deque(maxlen=PROBES_KEPT)
_writer: NodeWriter | None = None  # this node's, on local rank 0 only


def _local_rank_from_env() -> int:
    for key in ("LOCAL_RANK", "SLURM_LOCALID"):
        value = os.environ.get(key, "")
        if value.isdigit():
            return int(value)
    return 0


def _rank_from_env() -> int:
    for key in ("RANK", "SLURM_PROCID"):
        value = os.environ.get(key, "")
        if value.isdigit():
            return int(value)
    return 0


def start(run_dir: str) -> None:
    """Register the stack dump and write the first heartbeat. Only under the
    supervisor (it exports ``MESHRUN_ATTEMPT``): nothing reads them elsewhere."""
    global _run_dir, _rank, _stack_file
    attempt = os.environ.get(ATTEMPT_ENV, "")
    if not attempt or not os.path.isdir(run_dir):
        return
    _rank = _rank_from_env()
    try:
        os.makedirs(os.path.join(run_dir, STACKS_DIR), exist_ok=True)
        _stack_file = open(stack_path(run_dir, attempt, _rank), "w")  # noqa: SIM115 (kept open for faulthandler)
        faulthandler.register(STACK_SIGNAL, file=_stack_file, all_threads=True, chain=False)
        _run_dir = run_dir
        beat("startup", 0)
        if _local_rank_from_env() == 0:
            _start_writer()
        elif incarnation() > 0:  # in-process recovery: alone on a spare node?
            adopt_node_writer()
    except OSError as e:  # health reporting never stops training
        print(f"meshrun train: heartbeats off: {e}", file=sys.stderr)
        _run_dir = None


def _start_writer() -> None:
    global _writer
    assert _run_dir is not None
    _writer = NodeWriter(_run_dir)
    _writer.start()
    atexit.register(_writer.stop)


def _alive(pid: object) -> bool:
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def adopt_node_writer() -> None:
    """Under in-process recovery a node can lose its writer (its local rank
    0 died and was replaced on a spare node) or hold a replacement alone
    (on the spare): the node's lowest live rank (a node-local read of a few
    files) takes the writer over, so the supervisor keeps seeing the node's
    ranks. Nothing when this rank writes already or another live rank
    ranks lower."""
    if _run_dir is None or _writer is not None:
        return
    try:
        live = [r for r, h in read_local_heartbeats(_run_dir).items() if _alive(h.get("pid"))]
        if live and min(live) == _rank:
            _start_writer()
    except OSError as e:  # health reporting never stops training
        print(f"meshrun train: node heartbeat writer not taken over: {e}", file=sys.stderr)


def beat(phase: str, step: int = 0) -> None:
    """This rank's progress: ``phase`` (launcher.config.health.PHASES) at ``step``."""
    global _last
    if _run_dir is None:
        return
    _last = (phase, step)
    try:
        write_heartbeat(_run_dir, _rank, phase, step, {"probes": list(_probes)} if _probes else None)
    except OSError as e:
        print(f"meshrun train: heartbeat not written: {e}", file=sys.stderr)
    if phase == "done" and _writer is not None:
        _writer.flush()  # the last beat reaches the run dir before the process ends


def flush_node() -> None:
    """The node's heartbeat file now, from this node's current local beats,
    on any rank: a rank that fails calls it, so the supervisor attributes
    the fault at the step the rank really reached (the node writer copies
    only every NODE_WRITE_S, and may die with the step)."""
    if _run_dir is None:
        return
    (_writer or NodeWriter(_run_dir)).flush()


def active() -> bool:
    """Heartbeats are written (a supervised task)."""
    return _run_dir is not None


def probe(step: int, seconds: float, after_save: bool) -> None:
    """A solo probe's time at ``step``: kept and written at once (same phase and step)."""
    if _run_dir is None:
        return
    _probes.append([step, round(seconds, 6), after_save])
    beat(*_last)
