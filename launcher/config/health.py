"""The files a run's ranks and its batch-level supervisor share about health.

Standard library only: the trainer (``train/observe/heartbeat.py``) writes, the
supervisor (``launcher/selfheal/supervisor.py``) reads.

- each rank's progress, ``{"rank", "node", "pid", "job", "step_id",
  "attempt", "phase", "step", "time"}`` (phase one of :data:`PHASES`; any
  further field is carried through as is), rewritten atomically (write +
  rename) at every phase change and at the start of every training step
  into NODE-LOCAL storage: ``<local>/rank<R>.json``, ``<local>`` =
  :func:`local_heartbeat_dir` (``$MESHRUN_NODE_HEARTBEAT_DIR``, else
  /dev/shm or the temp dir, one folder per run dir, Slurm job and node).
- ``<run_dir>/heartbeats/node-<node>.json``: the node's ranks' last beats,
  ``{"node", "writer_pid", "time", "ranks": {"<R>": <rank's record>}}``,
  rewritten (write + rename) every :data:`NODE_WRITE_S` by ONE writer per
  node (the node's local rank 0: :class:`NodeWriter`). Each rank's record
  keeps its own ``time``, so a silent rank on a node whose writer is fine is
  still silent, and a node whose writer died freezes every record in its
  file. The shared file system sees 2 operations per node per
  :data:`NODE_WRITE_S` whatever the ranks per node and the step rate
  (scripts/bench_heartbeat.py). Older run dirs' ``heartbeats/rank<R>.json``
  (one per rank, the same record) are still read.
  From the process's first training step on, every record carries
  ``"first_step"`` and ``"first_step_at"`` (its time): the supervisor's
  resume measure, which a once-a-second sample could otherwise miss.
  A record may carry ``"probes": [[step, seconds, after_save], ...]``, the
  rank's newest solo probes (train/observe/probe.py) when it made any.
- ``<run_dir>/stragglers.json``: the supervisor's straggler scores
  (launcher/selfheal/straggler.py), served to Prometheus by rank 0.
- ``<run_dir>/stacks/<attempt>-rank<R>.txt``: the rank's Python stacks (all
  threads), written by :mod:`faulthandler` when it receives
  :data:`STACK_SIGNAL`. SIGURG: ignored by default (a rank that has not
  registered yet is not killed by it) and unused here otherwise: USR1 is
  NCCL's, USR2 and TERM mean checkpoint-and-stop (train/loop/signals.py).
- ``<run_dir>/faults.jsonl``: one JSON object per failure the supervisor
  saw (cause, node, evidence, what it did).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from launcher.config.runfiles import FAULTS_FILE, HEARTBEAT_DIR, STACKS_DIR

NODE_HEARTBEAT_ENV = "MESHRUN_NODE_HEARTBEAT_DIR"  # the node-local base (default /dev/shm)
# How often a node's writer rewrites its node file: 1 s adds at most a second
# (plus the supervisor's 1 s poll) to a hang limit of at least 120 s.
NODE_WRITE_S = 1.0
# "warmup": a process's first training step (start-up limit, as startup,
# restore and save); "step": every later one (the step limit).
PHASES = ("startup", "restore", "warmup", "step", "save", "done")
# The phases of a training step (a fault's step, the first resumed step).
STEP_PHASES = ("warmup", "step")
STACK_SIGNAL = signal.SIGURG
# Set by the supervisor for each srun it starts: "<SLURM_RESTART_COUNT>.<n>".
ATTEMPT_ENV = "MESHRUN_ATTEMPT"


# Where a collective's connection error names the peer it lost: gloo's
# "[ADDR]:PORT" ("Connection closed by peer [10.0.0.3]:12345", "Read error
# [10.0.0.3]:12345: Connection reset by peer"), NCCL's "HOST<PORT>" ("Last
# error: socketProgress: Connection closed by remote peer node2<42830>",
# "Call to recv from 10.200.84.247<58355> failed", "Got completion from peer
# 11.214.147.122<39138> with error 12").
PEER_ADDRESS = re.compile(r"\[(?P<gloo>[0-9A-Za-z.:%_-]+)\]:\d+|(?P<nccl>[0-9A-Za-z][\w.:-]*)<\d+>")


def peer_address(error: str) -> str | None:
    """The address or host a connection error names (None when it names none)."""
    m = PEER_ADDRESS.search(error)
    return (m.group("gloo") or m.group("nccl")) if m else None


def failure_line(error: str) -> str:
    """What ``failures.log`` keeps of a rank's error: its first line and, when
    a later line names a lost peer (NCCL's "Last error:" line), that line too."""
    lines = error.splitlines() or [""]
    first = lines[0][:300]
    if peer_address(first) is None:
        peer = next((x.strip() for x in lines[1:] if peer_address(x)), None)
        if peer:
            first += f" | {peer[:200]}"
    return first


def heartbeat_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    """Where this node keeps ``rank``'s own heartbeat (node-local)."""
    return local_heartbeat_dir(run_dir) / f"rank{rank}.json"


def node_heartbeat_path(run_dir: str | os.PathLike[str], node: str) -> Path:
    return Path(run_dir) / HEARTBEAT_DIR / f"node-{node}.json"


def local_heartbeat_dir(
    run_dir: str | os.PathLike[str], node: str | None = None, job: str | None = None
) -> Path:
    """This node's (or ``node``'s) folder of its ranks' heartbeats: one per
    run dir, Slurm job (``job``, default this process's) and node (test
    clusters run several nodes on one host). The job is in the name because
    a killed rank's file outlives its job: a later job in the same run dir
    path (the dir deleted and the run started again) read it back and saw a
    rank silent since the old job, a hang at its start."""
    base = os.environ.get(NODE_HEARTBEAT_ENV) or (
        "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    )
    digest = hashlib.sha256(os.path.abspath(run_dir).encode()).hexdigest()[:16]
    job = os.environ.get("SLURM_JOB_ID", "") if job is None else job
    return Path(base) / f"meshrun-hb-{digest}-{job or 'nojob'}-{node or node_name()}"


def stack_path(run_dir: str | os.PathLike[str], attempt: str, rank: int) -> Path:
    return Path(run_dir) / STACKS_DIR / f"{attempt}-rank{rank}.txt"


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


# (run dir, rank, attempt) -> this process's first training step and its time.
_first_steps: dict[tuple[str, int, str], tuple[int, float]] = {}


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_heartbeat(
    run_dir: str | os.PathLike[str],
    rank: int,
    phase: str,
    step: int,
    extra: dict[str, Any] | None = None,
    at: float | None = None,
) -> None:
    """Atomically replace this rank's node-local heartbeat (one small write
    + rename, on the node: nothing on the shared file system); ``extra``:
    more fields it carries (the solo probes, a script rank's ``active``);
    ``at``: the beat's time when it is not now (a beat rewritten with more
    fields, its time kept)."""
    now, attempt = (time.time() if at is None else at), os.environ.get(ATTEMPT_ENV, "")
    key = (os.fspath(run_dir), rank, attempt)
    if phase in STEP_PHASES and key not in _first_steps:
        _first_steps[key] = (step, now)
    rec = {
        **(extra or {}),
        "rank": rank,
        "node": node_name(),
        "pid": os.getpid(),
        "job": os.environ.get("SLURM_JOB_ID", ""),
        "step_id": os.environ.get("SLURM_STEP_ID", ""),
        "attempt": attempt,
        "phase": phase,
        "step": step,
        "time": now,
    }
    if key in _first_steps:  # kept in every later beat: a node file samples beats once a second
        rec["first_step"], rec["first_step_at"] = _first_steps[key]
    path = heartbeat_path(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(path, json.dumps(rec))


def read_local_heartbeats(run_dir: str | os.PathLike[str]) -> dict[int, dict[str, Any]]:
    """This node's ranks' own heartbeats (torn or partial files skipped)."""
    return _read_rank_files(local_heartbeat_dir(run_dir))


def _read_rank_files(d: Path) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    try:
        names = [e.name for e in os.scandir(d) if e.name.startswith("rank") and e.name.endswith(".json")]
    except OSError:
        return out
    for name in names:
        try:
            rec = json.loads((d / name).read_text())
            out[int(rec["rank"])] = rec
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


class NodeWriter:
    """The one writer per node: copies the node's ranks' local heartbeats
    into ``heartbeats/node-<node>.json`` every :data:`NODE_WRITE_S` (a daemon
    thread) and on :meth:`flush`. Run by the node's local rank 0 (the
    trainer's or taskwrap's task). A frozen rank's record stays frozen in
    the file (its own time); a dead writer freezes the file."""

    def __init__(self, run_dir: str | os.PathLike[str], interval_s: float = NODE_WRITE_S) -> None:
        self.run_dir = Path(run_dir)
        self.interval_s = interval_s
        self.node = node_name()
        self.errors = 0  # said once, counted
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def flush(self) -> None:
        """One node file from the node's current local heartbeats."""
        with self._lock:
            ranks = read_local_heartbeats(self.run_dir)
            rec = {
                "node": self.node,
                "writer_pid": os.getpid(),
                "time": time.time(),
                "ranks": {str(r): h for r, h in sorted(ranks.items())},
            }
            try:
                _write_atomic(node_heartbeat_path(self.run_dir, self.node), json.dumps(rec))
            except OSError as e:
                self.errors += 1
                if self.errors == 1:
                    print(f"meshrun: node heartbeat file not written ({self.errors} so far): {e}", flush=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.flush()

    def start(self) -> None:
        (self.run_dir / HEARTBEAT_DIR).mkdir(parents=True, exist_ok=True)
        self.flush()
        self._thread = threading.Thread(target=self._loop, name="meshrun-node-heartbeats", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """The last node file (a finished rank's ``done``), then no more; when
        every local rank is done, their node-local files are removed."""
        self._stop.set()
        self.flush()
        local = local_heartbeat_dir(self.run_dir)
        beats = read_local_heartbeats(self.run_dir)
        if beats and all(h.get("phase") == "done" for h in beats.values()):
            with contextlib.suppress(OSError):
                shutil.rmtree(local)


def read_heartbeats(run_dir: str | os.PathLike[str]) -> dict[int, dict[str, Any]]:
    """rank -> its last heartbeat (the record as written, every field kept),
    from the node files (and an older run dir's per-rank files); unreadable
    or partial files are skipped (the next poll reads them again)."""
    d = Path(run_dir) / HEARTBEAT_DIR
    try:
        names = [e.name for e in os.scandir(d)]
    except OSError:
        return {}
    out: dict[int, dict[str, Any]] = {}
    if any(n.startswith("rank") for n in names):
        out.update(_read_rank_files(d))
    for name in names:
        if not (name.startswith("node-") and name.endswith(".json")):
            continue
        try:
            ranks = json.loads((d / name).read_text())["ranks"]
            for r, h in ranks.items():
                # A rank in two node files (it moved nodes between attempts): the newer beat.
                if int(r) not in out or float(h.get("time", 0)) >= float(out[int(r)].get("time", 0)):
                    out[int(r)] = h
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return out


def append_fault(run_dir: str | os.PathLike[str], rec: dict[str, Any]) -> None:
    """One line of ``<run_dir>/faults.jsonl``."""
    with open(Path(run_dir) / FAULTS_FILE, "a") as f:
        f.write(json.dumps(rec, sort_keys=True, default=str) + "\n")


def read_faults(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    path = Path(run_dir) / FAULTS_FILE
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def fault_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts over ``faults.jsonl``: faults (by cause), restarts inside the
    allocation, in-process recoveries (launcher.in_process_recovery), requeues,
    and, per fault the run came back from, how (``recovery``: restart or
    in_process), seconds from the fault to the first resumed step and steps
    redone."""
    faults = [r for r in records if "cause" in r and "event" not in r]
    resumed = [r for r in records if r.get("event") == "resumed"]
    by_cause: dict[str, int] = {}
    for f in faults:
        by_cause[str(f["cause"])] = by_cause.get(str(f["cause"]), 0) + 1
    return {
        "faults": len(faults),
        "by_cause": by_cause,
        "restarts": sum(1 for f in faults if f.get("action") == "restart"),
        "requeues": sum(1 for f in faults if f.get("action") == "requeue"),
        "in_process": sum(1 for f in faults if f.get("action") == "in_process"),
        "seconds_lost": round(sum(float(r.get("seconds_lost", 0)) for r in resumed), 2),
        "steps_redone": sum(int(r.get("steps_redone", 0)) for r in resumed),
        "per_fault": [
            {k: r.get(k) for k in ("cause", "seconds_lost", "detect_s", "steps_redone", "first_step")}
            | {"recovery": r.get("recovery") or "restart", "state_from": r.get("state_from")}
            for r in resumed
        ],
        "last": (
            f"{faults[-1]['cause']} on {faults[-1].get('node') or 'no single node'}: "
            f"{faults[-1].get('error', '')} ({faults[-1].get('action', '')})"
            if faults
            else ""
        ),
    }
