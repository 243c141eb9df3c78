"""CheckpointManager: tiered, asynchronous checkpoints (the contract in
docs/CONTRACTS.md).

save(): takes references to the state and returns; a background thread
stages it (copies into CPU buffers in shared memory, reused by every save; on
a side CUDA stream on GPUs) while the next forward/backward runs, and an
optimizer pre-step hook holds the next ``optimizer.step()`` until
that copy is done: the loop is blocked at most for staging. (Assumes
model/optimizer tensors change only in ``optimizer.step()``, true for
meshrun's models: no BatchNorm/EMA buffers.) Everything after the copy runs
in this rank's checkpoint worker process (:mod:`train.checkpoint.worker`),
outside the trainer's interpreter: DCP writes the shards to tier 1 over the
workers' own gloo group, each worker hashes its rank's files, rank 0's
gathers the entries, ``manifest.json`` is written last (on every distinct
tier-1 directory), old local copies are pruned and the node leader's worker
uploads (:mod:`train.checkpoint.upload`). The next save waits for the
previous commit (the buffers are reused).

resume(): the newest step every rank can read. With node-local tier 1 a
node holds only its own ranks' shards: each node verifies (digests) the
files it holds, the ranks agree on the steps worth trying (held by every
node, or in a remote tier) and, per step, each rank plans its DCP load; the
items it reads from shards only other nodes hold are sent by those nodes
(at an unchanged layout: the replicated items DCP wrote once), and only
files no node holds are fetched from tier 2 / tier 3 (verified again). An
all-reduce (min) decides; bad copies are skipped with a warning. DCP
reshards model and optimizer to the current layout.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import shutil
import socket
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict_saver import _stateful_to_state_dict

from train.checkpoint.manifest import (
    DCP_METADATA,
    MANIFEST,
    Manifest,
    atomic_write_bytes,
    bytes_digest,
    check_files,
    extra_file_name,
    list_steps,
    read_manifest,
    step_dir_name,
    verify_file,
    write_manifest,
)
from train.checkpoint.store import Store, build_stores
from train.checkpoint.tiers import local_root, run_name
from train.checkpoint.upload import is_uploaded, uploaded_marker
from train.checkpoint.worker import SharedStager, WorkerHandle, WorkerSetup

log = logging.getLogger("meshrun.checkpoint")

# app_state keys saved through DCP (sharded, reshardable); the others
# (lr_scheduler, data, rng, progress) are small per-rank objects.
DCP_KEYS = ("model", "optim")


class _RemappedReader(dcp.FileSystemReader):
    """DCP's file reader, except that some items are read from elsewhere
    (bytes received from other nodes; storage index -> new location)."""

    def __init__(self, path: str, remap: dict[Any, Any]) -> None:
        super().__init__(path)
        self._remap_to = remap

    def set_up_storage_reader(self, metadata: Any, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        if self._remap_to:
            self.storage_data = {**self.storage_data, **self._remap_to}


def _optimizers(app_state: dict[str, Any]) -> list[Any]:
    """The torch optimizers behind app_state (a bare optimizer, or a Stateful
    holding them in ``optims`` / ``optimizers``, as train.state does)."""
    out: list[Any] = []
    for value in app_state.values():
        if isinstance(value, torch.optim.Optimizer):
            out.append(value)
        for attr in ("optims", "optimizers"):
            out += [o for o in getattr(value, attr, None) or [] if isinstance(o, torch.optim.Optimizer)]
    return out


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


class CheckpointManager:
    def __init__(self, spec: Any, dist_info: Any, *, stores: list[Store] | None = None) -> None:
        self.spec = spec
        self.info = dist_info
        self.storage = spec.cfg.storage
        self.root = local_root(spec)
        self.rank = dist_info.rank
        self.world_size = dist_info.world_size
        self.distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        # The save path's own group: DCP's background collectives never
        # interleave with the training group's.
        self.pg = dist.new_group(backend="gloo") if self.distributed else None
        # Main-thread decisions (time-based saves) on a third group, so they
        # never race the background thread on self.pg.
        self.ctl_pg = dist.new_group(backend="gloo") if self.distributed else None
        os.makedirs(self.root, exist_ok=True)
        me = (dist_info.node_rank, socket.gethostname(), os.path.realpath(self.root))
        everyone = self._all_gather(me)
        self.rank_nodes = [int(n) for n, _, _ in everyone]
        self.num_nodes = max(self.rank_nodes) + 1
        # One rank per distinct tier-1 directory writes manifests, prunes and
        # fetches; one rank per node uploads that node's files.
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
        remote = bool(self.storage.shared_dir or self.storage.s3_bucket)
        leader = self.dir_leader or self.node_leader
        self.stores = (
            stores
            if stores is not None
            else (build_stores(self.storage, run_name(spec)) if remote and leader else [])
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
        # The checkpoint worker process of this rank; its gloo group meets
        # on a TCPStore that trainer rank 0 hosts (port broadcast here).
        self._wstore = None
        port = 0
        if self.distributed and self.rank == 0:
            self._wstore = dist.TCPStore(
                dist_info.master_addr, 0, self.world_size, is_master=True, wait_for_workers=False
            )
            port = self._wstore.port
        port = int(self._all_gather(port)[0])
        self._uploads_here = self.node_leader and remote
        self.worker = WorkerHandle(
            WorkerSetup(
                rank=self.rank,
                world_size=self.world_size,
                node_rank=dist_info.node_rank,
                store_host=dist_info.master_addr,
                store_port=port,
                root=self.root,
                storage=self.storage,
                run_name=run_name(spec) if remote else "",
                config_hash=spec.config_hash(),
                mesh=dict(spec.plan.mesh_dims()),
                rank_nodes=self.rank_nodes,
                dir_leader=self.dir_leader,
                dir_leaders=self._dir_leaders,
                node_leader=self.node_leader,
                log_level=log.getEffectiveLevel(),
            )
        )
        self._barrier()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="ckpt-stage")
        self._staging: Future | None = None
        self._pending: int | None = None  # step handed to the worker, commit not yet seen
        self._stager = SharedStager(
            pin=torch.cuda.is_available() and str(dist_info.device).startswith("cuda")
        )
        self._sent_version = 0
        self._last_save_time = time.monotonic()
        self.last_saved_step = -1
        self.last_save_s = 0.0  # loop blocked by the last save (the trainer logs it)
        self.blocked_s: list[float] = []
        self.committed: list[int] = []
        self._preempted = False
        self._remap: dict[Any, Any] = {}
        self._held: threading.Event | None = None  # staging the next optimizer step waits for
        self._hooked: set[int] = set()  # optimizers that have the pre-step hook

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

    # -- when ----------------------------------------------------------------
    def should_save(self, step: int, *, final: bool = False, preempted: bool = False) -> bool:
        """Same answer on every rank (the caller passes agreed flags; the
        time-based trigger is agreed here with one small all-reduce)."""
        if step <= 0 or step == self.last_saved_step:
            return False
        if preempted:
            self._preempted = True
        if final or preempted:
            return True
        every = self.storage.save_every_steps
        if every > 0 and step % every == 0:
            return True
        if self.storage.save_every_min > 0:
            due = time.monotonic() - self._last_save_time >= 60.0 * self.storage.save_every_min
            return self._any_true(due, self.ctl_pg)
        return False

    # -- save ----------------------------------------------------------------
    def save(self, step: int, app_state: dict[str, Any]) -> None:
        """Returns once the loop may continue: after staging when async,
        after the commit otherwise."""
        t0 = time.perf_counter()
        if step == self.last_saved_step:
            return
        self._wait_pending()  # the buffers are reused: the previous commit first
        path = self._path(step)
        os.makedirs(path, exist_ok=True)
        extra = {}
        for key, value in app_state.items():
            if key not in DCP_KEYS:
                extra[key] = value.state_dict() if hasattr(value, "state_dict") else value
        buf = io.BytesIO()
        torch.save(extra, buf)
        # References to the live tensors; the copy happens in the staging
        # thread, overlapping the next forward/backward. Model and optimizer
        # tensors change only in optimizer.step(), so a pre-step hook holds
        # the next step until the copy is done.
        live = _stateful_to_state_dict({k: app_state[k] for k in DCP_KEYS if k in app_state})
        staged = threading.Event()
        self._pending = step
        self._staging = self._executor.submit(self._stage_and_send, step, path, live, buf.getvalue(), staged)
        optims = _optimizers(app_state)
        if not self.storage.async_save:
            self._wait_pending()
        elif optims:
            self._hold_optimizers(optims, staged)
        else:
            staged.wait()
        self.last_saved_step = step
        self._last_save_time = time.monotonic()
        self.last_save_s = time.perf_counter() - t0
        self.blocked_s.append(self.last_save_s)

    @property
    def upload_lag_s(self) -> float | None:
        """Commit-to-verified-upload seconds of the newest upload (None: none yet)."""
        return self.worker.upload_lag_s

    def _hold_optimizers(self, optims: list[Any], staged: threading.Event) -> None:
        # One pre-step hook per optimizer, registered once and never removed
        # (removing a hook from inside the hook loop breaks that loop when a
        # second hook follows): it waits for the staging in flight, if any.
        self._held = staged
        for opt in optims:
            if id(opt) not in self._hooked:
                opt.register_step_pre_hook(self._wait_for_staging)
                self._hooked.add(id(opt))

    def _wait_for_staging(self, *_: Any) -> None:
        staged, self._held = self._held, None
        if staged is None:
            return
        t0 = time.perf_counter()
        staged.wait()
        # The loop was blocked here too: count it against the save.
        self.blocked_s[-1] += time.perf_counter() - t0
        self.last_save_s = self.blocked_s[-1]

    def _stage_and_send(self, step: int, path: str, live: Any, extra: bytes, staged: threading.Event) -> None:
        """Staging thread: copy into the shared buffers, release the loop,
        hand the step to the worker (new buffers first when they changed)."""
        try:
            skel = self._stage(live)
        finally:
            staged.set()  # never leave the loop waiting, even on failure
        if self._stager.version != self._sent_version:
            self.worker.send("buffers", self._stager.buffers)
            self._sent_version = self._stager.version
        self.worker.send("save", step, path, skel, extra)

    def _stage(self, live: Any) -> Any:
        device = torch.device(getattr(self.info, "device", "cpu"))
        if device.type != "cuda" or not torch.cuda.is_available():
            return self._stager.stage(live)
        # Copy on a side stream of this rank's GPU (this thread's current
        # device is not the main thread's), after the compute stream's pending
        # work, so device-to-host copies overlap the next step's kernels.
        with torch.cuda.device(device):
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.default_stream(device))
            with torch.cuda.stream(side):
                out = self._stager.stage(live)
            side.synchronize()
        return out

    def _wait_pending(self, timeout_s: float | None = None) -> bool:
        """Wait for the worker's commit of the step in flight (False on
        timeout). A failed save is logged; its step is not committed."""
        if self._pending is None:
            return True
        step = self._pending
        t0 = time.monotonic()
        assert self._staging is not None
        try:
            self._staging.result(timeout=timeout_s)
        except TimeoutError:
            return False
        except Exception as e:
            self._pending = None
            if not self.worker.proc.is_alive():
                # No checkpoint can be written any more: fail the rank (a
                # restart resumes from the newest commit) rather than train on
                # without checkpoints.
                raise RuntimeError(
                    f"checkpoint worker (pid {self.worker.proc.pid}) died, exit code "
                    f"{self.worker.proc.exitcode}; step {step} is not committed"
                ) from e
            log.exception("checkpoint: staging step %d failed; it is not committed", step)
            return True
        left = None if timeout_s is None else max(0.0, timeout_s - (time.monotonic() - t0))
        reply = self.worker.recv("committed", left)
        if reply is None:
            return False
        self._pending = None
        _, done_step, error = reply
        assert done_step == step, (done_step, step)
        if error:
            log.error("checkpoint: a background save failed; step %d is not committed: %s", step, error)
        else:
            self.committed.append(step)
        return True

    # -- resume --------------------------------------------------------------
    def resume(self, app_state: dict[str, Any]) -> int:
        """Load the newest step every node can hold complete, 0 if none.

        Each tier-1 directory (one per node with node-local storage) holds
        only its own ranks' shards: a node checks the files its ranks will
        read, never the whole checkpoint. The ranks first agree on the steps
        worth trying (held in every directory, or in a remote tier), newest
        first; for each, every node verifies (and, only for what it lacks,
        downloads) its part, and an all-reduce (min) says whether all did."""
        remote: dict[str, list[int]] = {}
        if self.rank == 0:
            for store in self.stores:
                try:
                    remote[store.name] = store.complete_steps()
                except Exception as e:
                    log.warning(
                        "checkpoint: cannot list %s (%s: %s); resuming without it",
                        store.name,
                        type(e).__name__,
                        e,
                    )
        local = list_steps(self.root) if self.dir_leader else []
        gathered = self._all_gather((local, remote))
        remote = gathered[0][1]
        in_remote = {s for v in remote.values() for s in v}
        held = [set(gathered[r][0]) for r in self._dir_leaders]
        # Agreed on every rank from the same gathered lists: a step that some
        # node neither holds nor can download is never tried.
        candidates = sorted(
            {s for h in held for s in h if s in in_remote or all(s in other for other in held)} | in_remote,
            reverse=True,
        )
        for step in candidates:
            source = self._try_step(step, app_state, remote)
            if source is None:
                if self.rank == 0:
                    log.warning(
                        "checkpoint: step %d is not complete and valid on every node; trying an older one",
                        step,
                    )
                continue
            self._load(step, app_state, source)
            self.last_saved_step = step
            if self.dir_leader:
                self._drop_newer_local(step)
            if self._uploads_here:
                self._requeue_uploads()
            return step
        if self._uploads_here:
            self._requeue_uploads()
        return 0

    def _try_step(self, step: int, app_state: dict[str, Any], remote: dict[str, list[int]]) -> str | None:
        """Collective: make every rank able to read what it needs of
        ``step``. Returns the source (``local``, ``peers`` or a store's name),
        or None when some rank cannot; on success ``self._remap`` holds where
        this rank reads the items that live in other nodes' files."""
        self._remap = {}
        # 1. Every directory gets the step's manifest and DCP's .metadata
        #    (its own copy, or downloaded); all must be the same checkpoint.
        manifest, source = (None, "")
        if self.dir_leader:
            manifest, source = self._prepare(step, remote)
        heads = self._all_gather(manifest.to_json() if manifest is not None else None)
        leaders = [heads[r] for r in self._dir_leaders]
        if any(h is None for h in leaders):
            return None
        if len({Manifest.from_json(h).digest() for h in leaders}) > 1:
            if self.rank == 0:
                log.warning("checkpoint: the nodes hold different checkpoints of step %d", step)
            return None
        manifest = Manifest.from_json(heads[self._my_dir_leader])
        path = self._path(step)
        # 2. Each rank names what it will read (DCP's load plan); each
        #    directory verifies the files it holds.
        reads = self._planned_reads(path, app_state)
        src = self.rank if manifest.world_size == self.world_size else self.rank % manifest.world_size
        extra = extra_file_name(src)
        needed = {DCP_METADATA, extra} | (
            {i.relative_path for i in reads.values()} if reads is not None else set(manifest.files)
        )
        unknown = needed - set(manifest.files)
        if unknown:
            log.warning("checkpoint: step %d: files missing from its manifest: %s", step, sorted(unknown))
            needed -= unknown
        held: list[str] = self._verified_here(step, manifest) if self.dir_leader else []
        report = self._all_gather((sorted(needed), held))
        held_by = {r: set(report[r][1]) for r in self._dir_leaders}
        here = held_by[self._my_dir_leader]
        elsewhere = {n for r, h in held_by.items() if r != self._my_dir_leader for n in h}
        # 3. Files no node holds intact: download them (only those).
        ok, now_here = True, held
        if self.dir_leader:
            lacking = sorted(
                n
                for n in {n for r in self._dir_ranks for n in report[r][0]} - here
                if n == DCP_METADATA or (n not in elsewhere and self._downloads(n, manifest, report))
            )
            if lacking:
                ok, fetched_from = self._download(step, manifest, lacking, remote)
                source = fetched_from or source
                now_here = sorted(set(held) | set(lacking))
            if ok and read_manifest(path) is None:
                write_manifest(path, manifest)
        if not self._all_true(ok):
            return None
        after = self._all_gather(now_here)
        held_by = {r: set(after[r]) for r in self._dir_leaders}
        here = held_by[self._my_dir_leader]
        # 4. What this rank reads from files that only other nodes hold comes
        #    from those nodes over the job's own network (at an unchanged
        #    layout: the few replicated items DCP wrote once for all ranks).
        asks: list[tuple[str, int, int]] = []
        if extra not in here:
            asks.append((extra, 0, -1))
        for info in (reads or {}).values():
            if info.relative_path not in here:
                asks.append((info.relative_path, info.offset, info.length))
        if not self._any_true(bool(asks)):
            return source or "local"
        got = self._exchange(path, asks, held_by)
        if not self._all_true(got is not None):
            return None
        assert got is not None
        self._remap = self._place(step, path, manifest, got, reads or {})
        if self.rank == 0:
            log.info("checkpoint: step %d: read %d items from other nodes' copies", step, len(asks))
        return source or "peers"

    def _downloads(self, name: str, manifest: Manifest, report: list[Any]) -> bool:
        """Whether this directory downloads ``name``, which no node holds:
        the node whose rank wrote it, when that node reads it, else the
        first directory that reads it (the others get their bytes from it)."""
        readers = [r for r in self._dir_leaders if any(name in report[x][0] for x in self._dirs[r])]
        writer = manifest.files[name].rank
        owner_node = 0 if writer < 0 else manifest.rank_nodes[writer]
        owners = [r for r in readers if self.rank_nodes[r] == owner_node]
        return (owners or readers)[:1] == [self.rank]

    def _prepare(self, step: int, remote: dict[str, list[int]]) -> tuple[Manifest | None, str]:
        """This directory's manifest of ``step`` with a verified .metadata,
        from the local copy or else the first remote tier that has it."""
        path = self._path(step)
        manifest = read_manifest(path)
        if manifest is not None:
            entry = manifest.files.get(DCP_METADATA)
            problem = verify_file(path, DCP_METADATA, entry) if entry else "no .metadata in its manifest"
            if not problem:
                return manifest, "local"
            log.warning("checkpoint: local copy of step %d is not usable: %s", step, problem)
            # Incomplete until re-verified.
            Path(path, MANIFEST).unlink(missing_ok=True)
        for store in self.stores:
            if step not in remote.get(store.name, []):
                continue
            try:
                m = store.read_manifest(step)
                if m is None or DCP_METADATA not in m.files:
                    continue
                os.makedirs(path, exist_ok=True)
                if verify_file(path, DCP_METADATA, m.files[DCP_METADATA]):
                    store.fetch_files(step, [DCP_METADATA], path, m)
                return m, store.name
            except Exception as e:  # S3 down, credentials, a bad copy ...
                log.warning(
                    "checkpoint: cannot fetch step %d from %s (%s: %s)", step, store.name, type(e).__name__, e
                )
        return None, ""

    def _planned_reads(self, path: str, app_state: dict[str, Any]) -> dict[Any, Any] | None:
        """Where each item this rank loads lives (DCP's load plan at the
        current layout: storage index -> file, offset, length); None when the
        plan cannot be made (the load itself will then say why)."""
        from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

        try:
            metadata = dcp.FileSystemReader(path).read_metadata()
            planner = DefaultLoadPlanner()
            state = _stateful_to_state_dict({k: app_state[k] for k in DCP_KEYS if k in app_state})
            planner.set_up_planner(state, metadata, self.rank == 0)
            storage = metadata.storage_data
            return {
                item.storage_index: storage[item.storage_index] for item in planner.create_local_plan().items
            }
        except Exception as e:
            log.warning("checkpoint: cannot plan the load of %s (%s: %s)", path, type(e).__name__, e)
            return None

    def _verified_here(self, step: int, manifest: Manifest) -> list[str]:
        """The manifest's files this directory holds intact (digests checked)."""
        path = self._path(step)
        present = [n for n in manifest.files if os.path.exists(os.path.join(path, n))]
        problems = dict(zip(present, check_files(path, manifest, present, threads=8), strict=True))
        bad = {n: p for n, p in problems.items() if p}
        if bad:
            log.warning(
                "checkpoint: local copy of step %d is not usable: %s", step, "; ".join(list(bad.values())[:5])
            )
            Path(path, MANIFEST).unlink(missing_ok=True)  # incomplete until re-verified
            for n in bad:
                Path(path, n).unlink(missing_ok=True)
        return sorted(n for n in present if n not in bad)

    def _download(
        self, step: int, manifest: Manifest, names: list[str], remote: dict[str, list[int]]
    ) -> tuple[bool, str]:
        """Fetch ``names`` from a remote copy of this very checkpoint."""
        path = self._path(step)
        for store in self.stores:
            if step not in remote.get(store.name, []):
                continue
            try:
                m = store.read_manifest(step)
                if m is None or m.digest() != manifest.digest():
                    continue
                t0 = time.perf_counter()
                store.fetch_files(step, names, path, m)
                # This node's part of the step is in that tier already.
                Path(path, uploaded_marker(store.tier, self.info.node_rank)).touch()
                log.warning(
                    "checkpoint: fetched step %d from %s (%d files, %.1f MB in %.2f s)",
                    step,
                    store.name,
                    len(names),
                    sum(m.files[n].size for n in names) / 1e6,
                    time.perf_counter() - t0,
                )
                return True, store.name
            except Exception as e:  # S3 down, credentials, a bad copy ...
                log.warning(
                    "checkpoint: cannot fetch step %d from %s (%s: %s)", step, store.name, type(e).__name__, e
                )
        log.warning("checkpoint: step %d: no node and no reachable tier holds %s", step, ", ".join(names[:5]))
        return False, ""

    def _exchange(
        self, path: str, asks: list[tuple[str, int, int]], held_by: dict[int, set[str]]
    ) -> dict[tuple[str, int, int], bytes] | None:
        """Collective: every rank's byte ranges, served by the lowest rank
        leading a directory that holds the file verified. None on failure."""
        every = self._all_gather(asks)
        served: dict[tuple[str, int, int], bytes] = {}
        error = ""
        if self.dir_leader:
            try:
                for r, rank_asks in enumerate(every):
                    if r in self._dir_ranks:
                        continue
                    for name, offset, length in rank_asks:
                        holder = min((x for x, h in held_by.items() if name in h), default=None)
                        if holder == self.rank and (name, offset, length) not in served:
                            with open(os.path.join(path, name), "rb") as f:
                                f.seek(offset)
                                served[(name, offset, length)] = f.read() if length < 0 else f.read(length)
            except OSError as e:
                error = f"{type(e).__name__}: {e}"
        replies = self._all_gather((error, served))
        if any(e for e, _ in replies):
            log.warning("checkpoint: serving peers failed: %s", "; ".join(e for e, _ in replies if e))
            return None
        merged = {k: v for _, part in replies for k, v in part.items()}
        missing = [a for a in asks if a not in merged]
        if missing:
            log.warning("checkpoint: no node could serve %s", missing[:3])
            return None
        return {a: merged[a] for a in asks}

    def _place(
        self,
        step: int,
        path: str,
        manifest: Manifest,
        got: dict[tuple[str, int, int], bytes],
        reads: dict[Any, Any],
    ) -> dict[Any, Any]:
        """Whole files received go into the step directory (after their
        digest check); byte ranges into a per-rank side file that the load
        reads instead (storage index -> new location)."""
        side = os.path.join(self.root, f".peer-step{step}-rank{self.rank}.bin")
        where: dict[tuple[str, int], int] = {}
        with open(side, "wb") as f:
            for (name, offset, length), data in got.items():
                if length < 0:
                    entry = manifest.files[name]
                    if bytes_digest(data, entry.algo) != entry.digest:
                        raise RuntimeError(
                            f"step {step}: {name} received from a peer fails its {entry.algo} check"
                        )
                    atomic_write_bytes(os.path.join(path, name), data)
                else:
                    where[(name, offset)] = f.tell()
                    f.write(data)
        return {
            idx: dataclasses.replace(
                info, relative_path=side, offset=where[(info.relative_path, info.offset)]
            )
            for idx, info in reads.items()
            if (info.relative_path, info.offset) in where
        }

    def _drop_newer_local(self, step: int) -> None:
        """Local copies newer than the step resumed from belong to a history
        this run no longer follows (some node lacked them): remove them
        before this run saves those steps again."""
        for s in list_steps(self.root, complete_only=False):
            if s > step:
                log.warning("checkpoint: removing local step %d (newer than the resumed step %d)", s, step)
                Path(self._path(s), MANIFEST).unlink(missing_ok=True)
                shutil.rmtree(self._path(s), ignore_errors=True)

    def _load(self, step: int, app_state: dict[str, Any], source: str) -> None:
        path = self._path(step)
        manifest = read_manifest(path)
        assert manifest is not None, path
        if manifest.config_hash != self.spec.config_hash() and self.rank == 0:
            log.warning(
                "checkpoint: step %d was saved with another configuration (hash %s, now %s); loading anyway",
                step,
                manifest.config_hash,
                self.spec.config_hash(),
            )
        dcp_state = {k: app_state[k] for k in DCP_KEYS if k in app_state}
        try:
            dcp.load(
                dcp_state,
                storage_reader=_RemappedReader(path, self._remap),
                process_group=self.pg,
                no_dist=not self.distributed,
            )
        finally:
            for info in self._remap.values():
                Path(info.relative_path).unlink(missing_ok=True)
            self._remap = {}
        # Per-rank state: the same rank's when the world size is unchanged;
        # otherwise rank r takes rank (r mod old world size)'s.
        src = self.rank if manifest.world_size == self.world_size else self.rank % manifest.world_size
        extra = torch.load(os.path.join(path, extra_file_name(src)), map_location="cpu", weights_only=False)
        for key, value in extra.items():
            target = app_state.get(key)
            if target is not None and hasattr(target, "load_state_dict"):
                target.load_state_dict(value)
        if self.rank == 0:
            log.info(
                "checkpoint: resumed from step %d (%s copy; saved on %d ranks, mesh %s; now %d ranks, mesh %s)",
                step,
                source,
                manifest.world_size,
                manifest.mesh,
                self.world_size,
                dict(self.spec.plan.mesh_dims()),
            )

    def _requeue_uploads(self) -> None:
        """After a restart: upload the newest local checkpoint not yet in
        every tier (an upload interrupted by the crash, or S3 was down)."""
        steps = list_steps(self.root)
        if not steps:
            return
        newest = steps[-1]
        path = self._path(newest)
        if any(not is_uploaded(path, s.tier, self.info.node_rank) for s in self.stores):
            self.worker.send("upload", newest)

    # -- end -----------------------------------------------------------------
    def finalize(self, timeout_s: float | None = None) -> dict[str, Any]:
        """Wait for the pending save's commit, then (bounded) for uploads;
        log and return a report."""
        if timeout_s is None:
            timeout_s = 60.0 * self.storage.upload_timeout_min
            if self._preempted:
                # Slurm kills the job after the QOS grace time: leave it time to
                # exit and requeue; the next start finishes the upload.
                timeout_s = min(timeout_s, 0.5 * self.spec.cfg.qos.grace_time_s)
        t0 = time.monotonic()
        committed = self._wait_pending(timeout_s)
        report: dict[str, Any] = {
            "saves": len(self.blocked_s),
            "committed_steps": list(self.committed),
            "blocked_s_mean": sum(self.blocked_s) / len(self.blocked_s) if self.blocked_s else 0.0,
            "blocked_s_max": max(self.blocked_s, default=0.0),
            "commit_done": committed,
            "uploads_done": True,
        }
        if committed:
            # The worker waits (bounded) for its uploads and prunes.
            self.worker.send("finalize", max(0.0, timeout_s - (time.monotonic() - t0)))
            reply = self.worker.recv("report", max(5.0, timeout_s - (time.monotonic() - t0) + 30.0))
            if reply is not None:
                report.update(reply[1])
            else:
                report["uploads_done"] = False
        if self._uploads_here and not report["uploads_done"]:
            log.warning(
                "checkpoint: uploads still pending after %.0f s (steps %s); local copies kept in %s; "
                "the next start of this run uploads them",
                timeout_s,
                report.get("upload_pending", "?"),
                self.root,
            )
        if committed:
            self.worker.close()
        if self.rank == 0:
            log.info(
                "checkpoint: %d saves, loop blocked %.3f s mean / %.3f s max per save",
                report["saves"],
                report["blocked_s_mean"],
                report["blocked_s_max"],
            )
        self._executor.shutdown(wait=False)
        self.report = report
        return report

    def wait_uploads(self, timeout_s: float) -> bool:
        """Wait for the pending commit and this node's uploads (benchmarks, tests)."""
        self._wait_pending()
        if not self._uploads_here:
            return True
        self.worker.send("wait_uploads", timeout_s)
        reply = self.worker.recv("uploads", timeout_s + 30.0)
        return bool(reply and reply[1])
