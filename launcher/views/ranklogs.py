"""Where each rank's output of a run is, for ``meshrun status logs --rank N``
(and ``--rank all``) and the API's ``Run.logs(rank)``.

A Slurm job's task writes ``slurm/<job>_<task>_log.out`` (a sweep array's
task: the sweep folder's ``<array>_<index>_<task>_log.out``); a local run's
``logs/rank<N>.log``. A task is a rank, except under ``job.launch=torchrun``,
where it is a node's torchrun and its file holds the output of that node's
ranks: which ones torchrun's rendezvous gave it (global rank 0 may be on any
node) is the node's record (:func:`launcher.config.scriptjob.read_workers`);
before one is written, Slurm's node order is the guess.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.config.runfiles import LOGS_DIR, SLURM_DIR, SPEC_FILE, log_name
from launcher.config.scriptjob import read_workers


@dataclass
class RankLog:
    """The file holding rank ``rank``'s output, and every rank whose output it holds."""

    rank: int
    path: Path | None  # None: no output yet
    ranks: list[int] = field(default_factory=list)
    node: int | None = None  # a torchrun task's node (Slurm's order), else None

    def label(self, world: int | None, every: bool = False) -> str:
        """``rank 3 of 4``; a torchrun node's file ``rank 0 of 4 (node 1's
        torchrun: ranks 0-1)``, or with ``every`` (all ranks shown) ``ranks
        0-1 of 4 (node 1's torchrun)``."""
        of = f" of {world}" if world else ""
        if self.node is None:
            return f"rank {self.rank}{of}"
        if every:
            return f"ranks {span(self.ranks)}{of} (node {self.node}'s torchrun)"
        return f"rank {self.rank}{of} (node {self.node}'s torchrun: ranks {span(self.ranks)})"


def span(ranks: list[int]) -> str:
    """``0-3`` for consecutive ranks, else ``0,2``."""
    if ranks and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0])
    return ",".join(str(r) for r in ranks)


def _spec(run_dir: str | Path) -> dict[str, Any]:
    try:
        doc = json.loads((Path(run_dir) / SPEC_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def world_size(run_dir: str | Path) -> int | None:
    """The program's ranks (the plan's world size); None when the spec cannot be read."""
    world = (_spec(run_dir).get("plan") or {}).get("world_size")
    return int(world) if isinstance(world, int) and world > 0 else None


def _torchrun_rpn(run_dir: str | Path) -> int | None:
    """A job=script torchrun run's ranks per node (one task per node), else None."""
    spec = _spec(run_dir)
    job = (spec.get("cfg") or {}).get("job") or {}
    if job.get("kind") != "script" or job.get("launch") != "torchrun":
        return None
    rpn = (spec.get("plan") or {}).get("ranks_per_node")
    return int(rpn) if isinstance(rpn, int) and rpn > 0 else 1


def task_log(run_dir: str | Path, job_id: str, task: int) -> Path | None:
    """Slurm task ``task``'s output: <run_dir>/slurm/<id>_<task>_log.out, or
    for an array task the sweep folder's <array>_<index>_<task>_log.out."""
    for folder in (Path(run_dir) / SLURM_DIR, Path(run_dir).parent / SLURM_DIR):
        path = folder / f"{job_id}_{task}_log.out"
        if path.exists():
            return path
    return None


def rank_log(run_dir: str | Path, job_id: str | None, rank: int) -> RankLog:
    """The file holding global rank ``rank``'s output (its task's: a Slurm
    job's task file, else the wrapper's or local run's logs/rank<N>.log)."""
    rpn = _torchrun_rpn(run_dir)
    if rpn is None:
        task, first, ranks, node = rank, rank, [rank], None
    elif (w := read_workers(run_dir).get(rank)) is not None:
        task, first, node = int(w.get("task", 0)), int(w.get("log_rank", 0)), int(w.get("node", 0))
        ranks = sorted(int(r) for r in w.get("ranks", [rank]))
    else:  # its workers not seen yet: Slurm's node order
        node = rank // rpn
        task, first, ranks = node, node * rpn, list(range(node * rpn, node * rpn + rpn))
    local = Path(run_dir) / LOGS_DIR / log_name(first)
    path = task_log(run_dir, job_id, task) if job_id else None
    if path is None and local.exists():
        path = local
    return RankLog(rank, path, ranks, node)


def every_rank_log(run_dir: str | Path, job_id: str | None) -> list[RankLog]:
    """One per file in rank order (a torchrun node's file once, for all its ranks)."""
    world = world_size(run_dir) or 1
    out: list[RankLog] = []
    held: set[int] = set()
    for rank in range(world):
        if rank in held:
            continue
        rl = rank_log(run_dir, job_id, rank)
        held.update(rl.ranks)
        out.append(rl)
    return out


class RankError(ValueError):
    """A rank the run does not have."""


def check_rank(run_dir: str | Path, rank: int, point: str) -> None:
    """Refuse a rank the run does not have, naming the flag, the value and the ranks it has."""
    world = world_size(run_dir)
    if rank < 0 or (world is not None and rank >= world):
        has = f"ranks 0-{world - 1}" if world and world > 1 else "rank 0" if world else "ranks from 0"
        raise RankError(f"--rank {rank}: {point} has {has} (give one of them, or --rank all)")
