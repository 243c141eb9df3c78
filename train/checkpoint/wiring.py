"""Tier wiring of a CheckpointManager: the process groups of the save
path, which rank leads each tier-1 directory and each node, the remote
stores (tier 2 / tier 3), the per-rank checkpoint worker process, and the
collectives the save and resume paths share (:mod:`train.checkpoint.manager`
puts them together)."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import sys
from typing import Any

import torch
import torch.distributed as dist

from train.checkpoint.handle import WorkerHandle
from train.checkpoint.manifest import list_steps, step_dir_name
from train.checkpoint.store import Store
from train.checkpoint.tiers import build_stores, local_root, run_name
from train.checkpoint.worker import WorkerSetup

log = logging.getLogger("meshrun.checkpoint")

# app_state keys saved through DCP (sharded, reshardable); the others
# (lr_scheduler, data, rng, progress) are small per-rank objects.
DCP_KEYS = ("model", "optim")


def _ensure_log_handler(rank: int, verbose: bool) -> None:
    """Checkpoint events must reach the rank logs even when the host program
    configured no logging (warnings on every rank, progress on node leaders)."""
    if log.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"[ckpt rank {rank}] %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO if verbose else logging.WARNING)
    log.propagate = False


class Wiring:
    """The state every part of a CheckpointManager reads: who this rank is
    among the tier-1 directories and nodes, its groups, stores and worker."""

    def _wire(self, spec: Any, dist_info: Any, stores: list[Store] | None, deferred_worker: bool) -> None:
        """Collective (every rank): set up groups, directories, stores and
        the worker, in this order; returns after a barrier."""
        self.spec = spec
        self.info = dist_info
        self.storage = spec.cfg.storage
        self.root = local_root(spec)
        self.rank = dist_info.rank
        self.world_size = dist_info.world_size
        self._open_groups()
        os.makedirs(self.root, exist_ok=True)
        self._find_leaders()
        remote = bool(self.storage.shared_dir or self.storage.s3_bucket)
        self._attach_stores(stores, remote)
        self._start_worker(remote, deferred_worker)
        self._barrier()

    def _open_groups(self) -> None:
        self.distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        # The save path's own group: DCP's background collectives never
        # interleave with the training group's.
        self.pg = dist.new_group(backend="gloo") if self.distributed else None
        # Main-thread decisions (time-based saves) on a third group, so they
        # never race the background thread on self.pg.
        self.ctl_pg = dist.new_group(backend="gloo") if self.distributed else None

    def _find_leaders(self) -> None:
        """Collective: one rank per distinct tier-1 directory writes
        manifests, prunes and fetches; one rank per node uploads that node's
        files."""
        me = (self.info.node_rank, socket.gethostname(), os.path.realpath(self.root))
        everyone = self._all_gather(me)
        self.rank_nodes = [int(n) for n, _, _ in everyone]
        self.num_nodes = max(self.rank_nodes) + 1
        # Ranks by tier-1 directory, keyed by the directory's leader (lowest rank).
        self._dirs: dict[int, list[int]] = {}
        for r, e in enumerate(everyone):
            leader = next(x for x, o in enumerate(everyone) if o[1:] == e[1:])
            self._dirs.setdefault(leader, []).append(r)
        self._my_dir_leader = next(x for x, ranks in self._dirs.items() if self.rank in ranks)
        self._dir_ranks = self._dirs[self._my_dir_leader]
        self.dir_leader = self._my_dir_leader == self.rank
        self.node_leader = next(r for r, e in enumerate(everyone) if e[0] == me[0]) == self.rank
        _ensure_log_handler(self.rank, self.node_leader or self.dir_leader)
        self._dir_leaders = sorted(
            {next(r for r, e in enumerate(everyone) if e[1:] == x[1:]) for x in everyone}
        )

    def _attach_stores(self, stores: list[Store] | None, remote: bool) -> None:
        leader = self.dir_leader or self.node_leader
        self.stores = (
            stores
            if stores is not None
            else (build_stores(self.storage, run_name(self.spec)) if remote and leader else [])
        )
        if self.dir_leader:
            self._remove_incomplete()
        if self.rank == 0 and len(self._dir_leaders) > 1 and not self.stores:
            log.warning(
                "checkpoint: tier 1 (%s) is node-local on %d nodes and neither storage.shared_dir nor "
                "storage.s3_bucket is set: each node holds only its own shards, so these checkpoints "
                "cannot be resumed; set a shared or S3 tier",
                self.root,
                len(self._dir_leaders),
            )

    def _start_worker(self, remote: bool, deferred: bool) -> None:
        """Collective: the checkpoint worker process of this rank (``deferred``:
        spawned later, SCHED_IDLE from its start); its gloo group meets on a
        TCPStore that trainer rank 0 hosts (port broadcast here)."""
        self._wstore = None
        port = 0
        if self.distributed and self.rank == 0:
            self._wstore = dist.TCPStore(
                self.info.master_addr, 0, self.world_size, is_master=True, wait_for_workers=False
            )
            port = self._wstore.port
        port = int(self._all_gather(port)[0])
        self._uploads_here = self.node_leader and remote
        self.worker = WorkerHandle(
            WorkerSetup(
                rank=self.rank,
                world_size=self.world_size,
                node_rank=self.info.node_rank,
                store_host=self.info.master_addr,
                store_port=port,
                root=self.root,
                storage=self.storage,
                run_name=run_name(self.spec) if remote else "",
                config_hash=self.spec.config_hash(),
                mesh=dict(self.spec.plan.mesh_dims()),
                rank_nodes=self.rank_nodes,
                dir_leader=self.dir_leader,
                dir_leaders=self._dir_leaders,
                node_leader=self.node_leader,
                log_level=log.getEffectiveLevel(),
            ),
            deferred=deferred,
        )

    def start_worker(self) -> None:
        """Spawn a deferred worker now (no-op when it runs)."""
        self.worker.start()

    def worker_store_port(self) -> int:
        """The port of the worker's store this rank hosts (rank 0), else 0."""
        return self._wstore.port if self._wstore is not None else 0

    # -- collectives ---------------------------------------------------------
    def _all_gather(self, obj: Any, pg: Any = None) -> list[Any]:
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=pg or self.pg)
        return out

    def _barrier(self) -> None:
        if self.distributed:
            dist.barrier(group=self.pg)

    def _all_true(self, flag: bool, pg: Any = None) -> bool:
        if not self.distributed:
            return flag
        t = torch.tensor([1 if flag else 0], dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=pg or self.pg)
        return bool(t.item())

    def _any_true(self, flag: bool, pg: Any = None) -> bool:
        if not self.distributed:
            return flag
        t = torch.tensor([1 if flag else 0], dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=pg or self.pg)
        return bool(t.item())

    def _path(self, step: int) -> str:
        return os.path.join(self.root, step_dir_name(step))

    def _remove_incomplete(self) -> None:
        """Directories without a manifest are crashed saves or downloads."""
        complete = set(list_steps(self.root))
        for s in list_steps(self.root, complete_only=False):
            if s not in complete:
                log.info("checkpoint: removing incomplete %s (no manifest)", self._path(s))
                shutil.rmtree(self._path(s), ignore_errors=True)
