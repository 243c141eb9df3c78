"""The checkpoint worker: one process per rank that writes, commits and
uploads what the trainer staged, outside the trainer's interpreter.

The trainer copies its model and optimizer state into CPU buffers in shared
memory (allocated once, reused by every save; pinned on GPU machines) and
sends the worker the step, the state's structure and the small per-rank
extras. The worker, at a lower CPU and I/O priority, runs DCP's save from
those buffers over its own gloo group (the workers of all ranks rendezvous
on a TCPStore hosted by trainer rank 0), hashes its rank's files, gathers the
entries on rank 0, writes ``manifest.json`` last (on every distinct tier-1
directory), prunes old local copies and hands the step to the node's
uploader (node leaders only): the guarantees of the tiered design, moved out
of the training process. DTensor shards travel as their local tensor plus
the chunk DCP would record for them (:class:`ShardRef`, in
:mod:`train.checkpoint.staging`), so the worker needs no device mesh.

It dies with its trainer (PR_SET_PDEATHSIG: no writer outlives a killed
rank) and ignores Slurm's stop signals: the trainer decides when it ends.
The trainer's side (spawn, messages) is :mod:`train.checkpoint.handle`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from train.checkpoint.staging import Shard, resolve

log = logging.getLogger("meshrun.checkpoint")

# The worker's niceness, set always; it is what lowers the worker where
# SCHED_IDLE is unavailable (not Linux): ~1/10 of a core against a busy
# nice-0 process.
WORKER_NICE = 10
# Slurm sends these to every process of a step (preemption, time limit,
# scancel); the trainer decides when its worker stops.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


@dataclasses.dataclass(frozen=True)
class WorkerSetup:
    """What a worker needs to know; picklable (sent once at spawn)."""

    rank: int
    world_size: int
    node_rank: int
    store_host: str  # rendezvous of the workers' gloo group (world_size > 1)
    store_port: int
    root: str  # tier-1 directory of this rank
    storage: Any  # launcher.config.schema.StorageConfig
    run_name: str
    config_hash: str
    mesh: dict[str, int]
    rank_nodes: list[int]
    dir_leader: bool
    dir_leaders: list[int]
    node_leader: bool
    log_level: int  # the trainer's level for checkpoint messages


# -- the worker process --------------------------------------------------------


def _die_with_parent() -> None:
    from train.observe.lifeline import _set_pdeathsig

    _set_pdeathsig()
    if os.getppid() == 1:  # the trainer died before the prctl took effect
        os._exit(1)


def _lower_priority() -> None:
    """SCHED_IDLE (Linux): the worker runs on cores the training loop leaves
    idle, and a waking training thread preempts it at once; at nice 10 the
    worker kept its slice, and with ranks in lock-step (every collective
    waits for the slowest) each such slice stalled all of them: 2 ranks on 2
    cores, added s per save 0.318 at nice 10, 0.108 at SCHED_IDLE
    (scripts/bench_checkpoint.py). Never starved for good: a trainer that
    waits for its worker (the next save, the final one, preemption) leaves
    its core idle."""
    with contextlib.suppress(OSError):
        os.nice(WORKER_NICE)
    idle_threads()


def idle_threads(pid: int | None = None) -> None:
    """SCHED_IDLE on every thread of this process or ``pid`` (again once torch and gloo started theirs)."""
    if not hasattr(os, "SCHED_IDLE"):
        return
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid or 'self'}/task")]
    except OSError:
        tids = [pid or 0]
    for tid in tids:
        with contextlib.suppress(OSError):  # a thread that just ended
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))


def serve(conn: Any, setup: WorkerSetup, lag: Any, beat: Any) -> None:
    """The worker's main loop (the target of the spawned process). ``beat``
    (shared with the trainer) is the ``time.monotonic()`` of the worker's
    last progress: a message taken, a chunk of a file written, a phase of a
    save finished; the trainer treats a save whose worker stops beating for
    ``storage.worker_stall_timeout_s`` as failed."""
    _die_with_parent()
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # blocked since the fork
    _lower_priority()
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(f"[ckpt rank {setup.rank}] %(levelname)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(setup.log_level)
        log.propagate = False
    import torch

    # One thread: the worker must not fan out over the trainer's cores.
    torch.set_num_threads(1)
    # No zip CRC32 per record (a third of the write's CPU): every file's
    # digest in the manifest already covers it, and torch.load reads such
    # files as usual.
    torch.serialization.set_crc32_options(False)
    try:
        committer = _Committer(setup, lag, beat)
    except BaseException as e:  # noqa: BLE001 (reported to the trainer, which raises)
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    idle_threads()
    beat.value = time.monotonic()
    conn.send(("ready",))
    buffers: list[Any] = []
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        beat.value = time.monotonic()
        kind = msg[0]
        if kind == "buffers":
            buffers = msg[1]
        elif kind == "save":
            # A save the trainer could not stage still comes (with its error
            # and no state): this worker takes part in the save's collectives
            # with nothing to write, and the commit fails on every rank.
            _, step, path, skel, extra, error = msg
            state = resolve(skel, buffers) if not error else {}
            error = committer.save(step, path, state, extra, error)
            conn.send(("committed", step, error))
        elif kind == "upload":
            committer.submit_upload(msg[1])
        elif kind == "wait_uploads":
            conn.send(("uploads", committer.wait_uploads(msg[1])))
        elif kind == "finalize":
            conn.send(("report", committer.finalize(msg[1])))
        elif kind == "close":
            committer.close()
            return


class _Committer:
    """Write, commit, prune, upload: the work the trainer hands off."""

    def __init__(self, setup: WorkerSetup, lag: Any, beat: Any) -> None:
        import torch.distributed as dist

        from train.checkpoint.tiers import build_stores
        from train.checkpoint.upload import Uploader

        self.setup = setup
        self.storage = setup.storage
        self.lag = lag
        self.beat = beat
        self.save_started = time.monotonic()  # the current save's start (its commit line says how long)
        self.distributed = setup.world_size > 1
        self.pg = None
        if self.distributed:
            store = dist.PrefixStore(
                "meshrun-ckpt-worker/",
                dist.TCPStore(setup.store_host, setup.store_port, is_master=False, timeout=_timedelta(600)),
            )
            dist.init_process_group("gloo", store=store, rank=setup.rank, world_size=setup.world_size)
            # Every mesh up before any reports ready: else a worker of a run that
            # ends at once exits while a peer still connects (connectFullMesh).
            dist.barrier()
            self.pg = dist.group.WORLD
        remote = bool(self.storage.shared_dir or self.storage.s3_bucket)
        self.uploader: Uploader | None = None
        if setup.node_leader and remote:
            self.uploader = Uploader(
                setup.root,
                build_stores(self.storage, setup.run_name),
                node=setup.node_rank,
                keep_remote=self.storage.keep_remote,
                retry_max_s=float(self.storage.upload_retry_max_s),
                marker_timeout_s=float(self.storage.upload_marker_timeout_s),
                on_uploaded=self._uploaded,
            )

    def _uploaded(self, lag_s: float) -> None:
        self.lag.value = lag_s

    # -- collectives (the workers' own group) --------------------------------
    def _all_gather(self, obj: Any) -> list[Any]:
        import torch.distributed as dist

        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.setup.world_size
        dist.all_gather_object(out, obj, group=self.pg)
        return out

    def _broadcast_metadata(self, path: str) -> bytes | None:
        """DCP's .metadata for tier-1 directories other than rank 0's."""
        import torch.distributed as dist

        from train.checkpoint.manifest import DCP_METADATA

        if not self.distributed or len(self.setup.dir_leaders) == 1:
            return None
        box = [Path(path, DCP_METADATA).read_bytes() if self.setup.rank == 0 else None]
        dist.broadcast_object_list(box, src=0, group=self.pg)
        return box[0]

    # -- save + commit ---------------------------------------------------------
    def save(self, step: int, path: str, state: Any, extra: bytes, error: str = "") -> str:
        """DCP save of the staged state, then the commit; every worker takes
        part in every collective, failed or not (``error``: this rank's save
        failed before the worker got it). Returns "" or the error."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        self.save_started = time.monotonic()
        fs = _hashing_fs(self._beat)
        try:
            writer = dcp.FileSystemWriter(path, sync_files=True, thread_count=1)
            writer.fs = fs  # each data file hashed as it is written: no second read
            dcp.save(
                state,
                storage_writer=writer,
                planner=_planner(),
                process_group=self.pg,
                no_dist=not self.distributed,
            )
        # DCP raises a failed write as CheckpointException, a BaseException:
        # uncaught, it killed the worker.
        except (Exception, CheckpointException) as e:  # noqa: BLE001 (reported in the commit's gather)
            error = error or f"rank {self.setup.rank}: {type(e).__name__}: {_first_cause(e)}"
        self._beat()
        try:
            self._commit(step, path, extra, error, fs.digests)
        except Exception as e:  # noqa: BLE001
            return f"{type(e).__name__}: {e}"
        return ""

    def _beat(self) -> None:
        self.beat.value = time.monotonic()

    def _commit(
        self, step: int, path: str, extra: bytes, error: str, digests: dict[str, tuple[int, str]]
    ) -> None:
        from train.checkpoint.manifest import (
            DCP_METADATA,
            FileEntry,
            Manifest,
            atomic_write_bytes,
            bytes_digest,
            describe_files,
            extra_file_name,
            write_manifest,
        )
        from train.checkpoint.retention import prune_local

        rank = self.setup.rank
        entries: dict[str, FileEntry] = {}
        if not error:
            try:
                atomic_write_bytes(os.path.join(path, extra_file_name(rank)), extra)
                mine = [n for n in os.listdir(path) if n.startswith(f"__{rank}_")]
                entries = {extra_file_name(rank): FileEntry(len(extra), bytes_digest(extra), rank)}
                for name in mine:
                    size, digest = digests.get(name, (-1, ""))
                    if size == os.stat(os.path.join(path, name)).st_size:
                        entries[name] = FileEntry(size, digest, rank)
                    else:  # not written through the hashing stream: read it
                        entries.update(describe_files(path, [name], rank))
                if rank == 0:
                    entries.update(describe_files(path, [DCP_METADATA], -1))
            except Exception as e:  # noqa: BLE001
                error = f"rank {rank}: {type(e).__name__}: {e}"
        reports = self._all_gather((error, entries))
        errors = [e for e, _ in reports if e]
        if errors:
            if rank == 0:
                log.error("checkpoint: step %d not committed: %s", step, "; ".join(errors))
            raise RuntimeError(f"step {step} not committed: {'; '.join(errors)}")
        manifest = Manifest(
            step=step,
            config_hash=self.setup.config_hash,
            world_size=self.setup.world_size,
            mesh=dict(self.setup.mesh),
            rank_nodes=list(self.setup.rank_nodes),
            files={k: v for _, ents in reports for k, v in ents.items()},
            created_unix=time.time(),
        )
        metadata = self._broadcast_metadata(path)
        if self.setup.dir_leader:
            if metadata is not None and not os.path.exists(os.path.join(path, DCP_METADATA)):
                atomic_write_bytes(os.path.join(path, DCP_METADATA), metadata)
            write_manifest(path, manifest)  # the commit point
            protected = (self.uploader.protected() if self.uploader else set()) | {step}
            prune_local(self.setup.root, self.storage.keep_local, protected)
        if rank == 0:
            log.info(
                "checkpoint: step %d committed to %s (%.1f MB, %d files) in %.1f s",
                step,
                path,
                manifest.total_bytes / 1e6,
                len(manifest.files),
                time.monotonic() - self.save_started,
            )
        if self.uploader is not None:
            self.uploader.submit(step, manifest)

    # -- uploads -----------------------------------------------------------------
    def submit_upload(self, step: int) -> None:
        if self.uploader is not None:
            self.uploader.submit(step)

    def wait_uploads(self, timeout_s: float) -> bool:
        return self.uploader.wait(timeout_s) if self.uploader is not None else True

    def finalize(self, timeout_s: float) -> dict[str, Any]:
        from train.checkpoint.retention import prune_local

        done = self.wait_uploads(timeout_s)
        if self.setup.dir_leader:
            # Copies kept while their upload was in flight can go now.
            prune_local(
                self.setup.root, self.storage.keep_local, self.uploader.protected() if self.uploader else ()
            )
        report: dict[str, Any] = {"uploads_done": done}
        up = self.uploader
        if up is not None:
            report.update(
                uploaded=dict(up.done),
                upload_mb=up.bytes_uploaded / 1e6,
                upload_mb_per_s=up.bytes_uploaded / 1e6 / up.upload_seconds if up.upload_seconds else 0.0,
                upload_failures=up.failures,
                upload_pending=sorted(up.protected()),
            )
            if done:
                log.info("checkpoint: uploads complete: %s", up.done)
        return report

    def close(self) -> None:
        import torch.distributed as dist

        if self.uploader is not None:
            self.uploader.close()
        if self.distributed and dist.is_initialized():
            dist.destroy_process_group()


def _first_cause(e: BaseException) -> str:
    """A DCP CheckpointException's message is its ranks' whole tracebacks:
    keep the last line of each (the error itself)."""
    failures = getattr(e, "failures", None)
    if isinstance(failures, dict) and failures:
        excs = {r: x[0] if isinstance(x, tuple) else x for r, x in failures.items()}  # (exception, trace)
        return "; ".join(f"DCP rank {r}: {type(x).__name__}: {x}" for r, x in sorted(excs.items()))
    return str(e)


def _timedelta(seconds: float) -> Any:
    import datetime

    return datetime.timedelta(seconds=seconds)


def _hashing_fs(beat: Any = None) -> Any:
    """DCP's local FileSystem whose files are written with O_DIRECT and
    hashed as they are written (:mod:`train.checkpoint.direct`: no page-cache
    copy, no second read), recording (size, digest) of each, by file name, in
    ``.digests``; ``beat()`` is called for every chunk written (progress)."""
    from torch.distributed.checkpoint.filesystem import FileSystem

    from train.checkpoint.direct import DirectHashingWriter
    from train.checkpoint.manifest import new_hasher

    class _HashingFileSystem(FileSystem):
        def __init__(self) -> None:
            super().__init__()
            self.digests: dict[str, tuple[int, str]] = {}

        @contextlib.contextmanager
        def create_stream(self, path: Any, mode: str) -> Any:
            if "w" not in mode:
                with super().create_stream(path, mode) as f:
                    yield f
                return
            with _BeatingWriter(path, new_hasher(), beat) as stream:
                yield stream
            self.digests[os.path.basename(str(path))] = (stream.size, stream.hexdigest())

    class _BeatingWriter(DirectHashingWriter):
        def __init__(self, path: Any, hasher: Any, beat: Any) -> None:
            super().__init__(path, hasher)
            self._on_chunk = beat

        def _write_chunk(self, n: int) -> None:
            super()._write_chunk(n)
            if self._on_chunk is not None:
                self._on_chunk()

    return _HashingFileSystem()


def _planner() -> Any:
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    class _ShardPlanner(DefaultSavePlanner):
        """DCP's planner, resolving Shard leaves to their local tensor."""

        def lookup_object(self, index: Any) -> Any:
            obj = self.state_dict[index.fqn]
            if isinstance(obj, Shard):
                return obj.local
            return super().lookup_object(index)

    return _ShardPlanner()
