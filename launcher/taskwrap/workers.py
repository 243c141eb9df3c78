"""Which task reports a job=script program's progress and result: the one
hosting the program's global ``RANK`` 0.

With ``job.launch=tasks`` that is task 0 (the wrapper gives each task its
rank). Under ``job.launch=torchrun`` the wrapper is one per node and the
program's ranks are torchrun's workers, numbered by torchrun's c10d
rendezvous, which may put global rank 0 on any node (it sorts the nodes by
host name). The wrapper reads its workers' ranks from their environment
(``RANK`` in ``/proc/<pid>/environ`` of the agent's descendants: torchrun
sets it in each worker's), reports the program's steps and result only
where rank 0 runs, and records the node's ranks and log for the views
(:func:`launcher.config.scriptjob.workers_path`: ``meshrun status logs
--rank N``). Standard library only, as the wrapper.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from pathlib import Path

from launcher.config.health import ATTEMPT_ENV
from launcher.config.scriptjob import read_workers, workers_path
from launcher.taskwrap.report import say
from launcher.taskwrap.taskenv import Ranks

# Set by torchrun in each worker's environment (torch.distributed.elastic's local agent).
TORCHRUN_WORKER_ENV = "TORCHELASTIC_RUN_ID"
# Workers never seen (ended before a look, /proc unreadable): other tasks' records
# (a shared file system) are read at most this often.
READ_S = 1.0


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants, parents first (``/proc/<p>/task/<t>/children``);
    [] where /proc cannot be read."""
    out, todo, seen = [], [pid], set()
    while todo:
        p = todo.pop(0)
        if p in seen:
            continue
        seen.add(p)
        out.append(p)
        with contextlib.suppress(OSError, ValueError):
            for task in os.scandir(f"/proc/{p}/task"):
                with open(os.path.join(task.path, "children")) as f:
                    todo += [int(c) for c in f.read().split()]
    return out


def environ(pid: int) -> dict[str, str]:
    """A process's environment as it started ({} when it cannot be read: gone, another user's)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def worker_ranks(agent: int) -> list[int]:
    """The global ranks of torchrun's workers among the program's processes
    (the agent, or an interpreter shim in front of it, and their
    descendants: a DataLoader's workers keep their worker's), sorted. A
    worker is known by the run id torchrun gives it beside its ranks; a
    process above the workers may carry the task's own RANK (a local run's)."""
    ranks = set()
    for p in process_tree(agent):
        env = environ(p)
        rank = env.get("RANK", "")
        if rank.isdigit() and "LOCAL_RANK" in env and TORCHRUN_WORKER_ENV in env:
            ranks.add(int(rank))
    return sorted(ranks)


class Workers:
    """Whether this task hosts the program's global rank 0 (:meth:`main`)."""

    def __init__(self, run_dir: Path, me: Ranks, torchrun: bool, env: dict[str, str]) -> None:
        self.run_dir, self.me, self.torchrun, self.env = run_dir, me, torchrun, env
        # The global ranks of this node's workers, once all of them were seen
        # (fixed for the program's life: torchrun runs with --max-restarts=0).
        self.ranks: list[int] | None = None if torchrun else [me.rank]
        self.agent: int | None = None
        self.started = 0.0
        self.elsewhere: bool | None = None  # another task's record names rank 0 (read when none are seen)
        self.next_read = 0.0
        self.lock = threading.Lock()  # the output threads and the wrapper's loop ask

    def start(self, agent: int) -> None:
        """The program (torchrun's agent) started as ``agent``; an earlier start's record removed."""
        self.agent, self.started = agent, time.time()
        if self.torchrun:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(workers_path(self.run_dir, self.me.rank))

    def poll(self) -> None:
        """Look for the workers' ranks until all are seen (a few small
        /proc reads: the wrapper's loop and each new step look)."""
        with self.lock:
            if self.ranks is not None or self.agent is None:
                return
            found = worker_ranks(self.agent)
            if len(found) < self.me.local_world:
                return  # none yet, or torchrun still starting them: a partial set would mislead
            self.ranks = found
        self.record(found)

    def record(self, ranks: list[int]) -> None:
        """The node's ranks, its log and Slurm task, for the views (``meshrun status logs --rank N``)."""
        task = self.env.get("SLURM_PROCID", "")
        doc = {
            "ranks": ranks,
            "log_rank": self.me.rank,
            "task": int(task) if task.isdigit() else self.me.node,
            "node": self.me.node,
            "host": self.env.get("SLURMD_NODENAME") or socket.gethostname(),
            "job": self.env.get("SLURM_JOB_ID", ""),
            "attempt": self.env.get(ATTEMPT_ENV, ""),
            "time": time.time(),
        }
        path = workers_path(self.run_dir, self.me.rank)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        try:
            tmp.write_text(json.dumps(doc))
            os.replace(tmp, path)
        except OSError as e:
            say(f"the node's ranks not recorded in {path}: {e}")
        if 0 in ranks:
            say(
                f"ranks {ranks[0]}-{ranks[-1]} here (torchrun's rendezvous): the program's rank 0 reports from here"
            )

    def main(self) -> bool:
        """This task reports the program's steps and result: it hosts global
        rank 0. Workers never seen (ended before a look, /proc unreadable):
        the first node's task, unless another task of this start found rank
        0 among its workers."""
        self.poll()
        with self.lock:
            if self.ranks is not None:
                return 0 in self.ranks
            if self.me.rank != 0:
                return False
            if self.elsewhere is None or time.monotonic() >= self.next_read:
                self.next_read = time.monotonic() + READ_S
                other = read_workers(self.run_dir).get(0) or {}
                mine = (self.env.get("SLURM_JOB_ID", ""), self.env.get(ATTEMPT_ENV, ""))
                # This start's (a local run has neither id: its time; a minute for nodes' clocks).
                now = float(other.get("time") or 0.0) >= self.started - 60.0
                self.elsewhere = (other.get("job"), other.get("attempt")) == mine and now
            return not self.elsewhere
