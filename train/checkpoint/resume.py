"""The resume path of a CheckpointManager: the newest step every rank can
read. Each node verifies (digests) the files it holds, the ranks agree on
the steps worth trying, and per step each rank plans its DCP load; items it
reads from shards only other nodes hold are sent by those nodes, and only
files no node holds are fetched from tier 2 / tier 3 (verified again). An
all-reduce (min) decides; bad copies are skipped with a warning."""

from __future__ import annotations

import dataclasses
import os
import pickle
import shutil
import time
from pathlib import Path
from typing import Any

import torch
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
    verify_file,
    write_manifest,
)
from train.checkpoint.upload import is_uploaded, uploaded_marker
from train.checkpoint.wiring import DCP_KEYS, Wiring, log

# Listing a remote tier at resume: attempts, and the wait before the second
# (doubling after each), beyond the client's own retries.
LIST_ATTEMPTS = 3
LIST_RETRY_S = 2.0


def _list_with_retries(store: Any) -> list[int]:
    """The store's complete steps; raises the last error after
    LIST_ATTEMPTS failed attempts."""
    for attempt in range(LIST_ATTEMPTS):
        try:
            return store.complete_steps()
        except Exception as e:
            if attempt == LIST_ATTEMPTS - 1:
                raise
            log.warning(
                "checkpoint: cannot list %s (attempt %d of %d: %s: %s); retrying",
                store.name,
                attempt + 1,
                LIST_ATTEMPTS,
                type(e).__name__,
                str(e).splitlines()[0][:300] if str(e) else "",
            )
            time.sleep(LIST_RETRY_S * 2**attempt)
    raise AssertionError("unreachable")


def load_extra(path: str) -> dict[str, Any]:
    """A rank's small state (scheduler, data position, RNG, progress): plain
    containers, numbers and tensors, read with ``weights_only=True``. Such a
    file may come from shared or remote storage: a pickle that would build
    anything else (run code) is refused, not executed."""
    try:
        extra = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise RuntimeError(
            f"{path}: refused: it is not plain tensors and containers (torch.load weights_only=True: "
            f"{str(e).splitlines()[0][:300]}); whoever can write the checkpoint's storage may have "
            "replaced it"
        ) from e
    if not isinstance(extra, dict):
        raise RuntimeError(f"{path}: refused: holds a {type(extra).__name__}, not a dict of states")
    return extra


def match_checkpoint(states: dict[str, Any], metadata: Any) -> None:
    """Let each state that can take more than one form (train/loop/state.py:
    OptimState) take the checkpoint's before its template is made."""
    for name, value in states.items():
        if hasattr(value, "match_checkpoint"):
            value.match_checkpoint(
                k[len(name) + 1 :] for k in metadata.state_dict_metadata if k.startswith(name + ".")
            )


class _RemappedReader(dcp.FileSystemReader):
    """DCP's file reader, except that some items are read from elsewhere
    (bytes received from other nodes; storage index -> new location)."""

    def __init__(self, path: str, remap: dict[Any, Any]) -> None:
        super().__init__(path)
        self._remap_to = remap
        self._metadata: dict[Any, Any] = {}

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        # Read once (the load matches its states to it first, then DCP reads
        # it again): megabytes of pickled index on an 80-layer model.
        key = kwargs.get("rank")
        if key not in self._metadata:
            self._metadata[key] = super().read_metadata(*args, **kwargs)
        metadata = self._metadata[key]
        metadata.storage_meta.load_id = self.load_id  # DCP's reset() may have made a new one
        return metadata

    def set_up_storage_reader(self, metadata: Any, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        if self._remap_to:
            self.storage_data = {**self.storage_data, **self._remap_to}


class ResumePath(Wiring):
    _remap: dict[Any, Any]

    def resume(self, app_state: dict[str, Any]) -> int:
        """Load the newest step every node can hold complete, 0 if none.

        Each tier-1 directory (one per node with node-local storage) holds
        only its own ranks' shards: a node checks the files its ranks will
        read, never the whole checkpoint. The ranks first agree on the steps
        worth trying (held in every directory, or in a remote tier), newest
        first; for each, every node verifies (and, only for what it lacks,
        downloads) its part, and an all-reduce (min) says whether all did."""
        remote: dict[str, list[int]] = {}
        unlisted: dict[str, str] = {}
        if self.rank == 0:
            for store in self.stores:
                try:
                    remote[store.name] = _list_with_retries(store)
                except Exception as e:
                    unlisted[store.name] = (
                        f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
                    )
        local = list_steps(self.root) if self.dir_leader else []
        gathered = self._all_gather((local, remote, unlisted))
        remote, unlisted = gathered[0][1], gathered[0][2]
        self._refuse_unlisted(unlisted)
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

    def _refuse_unlisted(self, unlisted: dict[str, str]) -> None:
        """A remote tier that could not be listed may hold the newest
        checkpoint: resuming without it would silently restart from older
        local copies, or from step 0. Every rank raises, unless
        ``launcher.resume=local_only`` says to go on without it."""
        if not unlisted:
            return
        tiers = "; ".join(f"{name} ({why})" for name, why in unlisted.items())
        if self.spec.cfg.launcher.resume == "local_only":
            if self.rank == 0:
                log.warning(
                    "checkpoint: cannot list %s after %d attempts; resuming from what is known without it "
                    "(launcher.resume=local_only)",
                    tiers,
                    LIST_ATTEMPTS,
                )
            return
        raise RuntimeError(
            f"cannot list the checkpoint tier {tiers} after {LIST_ATTEMPTS} attempts; not resuming without "
            "it (its newest checkpoint may be newer than any other copy: starting anyway could silently "
            "restart from an older step or from step 0). Make the tier reachable and start again, or "
            "resume from what the other tiers hold with launcher.resume=local_only"
        )

    def _try_step(self, step: int, app_state: dict[str, Any], remote: dict[str, list[int]]) -> str | None:
        """Collective: make every rank able to read what it needs of
        ``step``. Returns the source (``local``, ``peers`` or a store's name),
        or None when some rank cannot; on success ``self._remap`` holds where
        this rank reads the items that live in other nodes' files."""
        self._remap = {}
        # 1. Every directory gets the step's manifest and DCP's .metadata
        #    (its own copy, or downloaded); all must be the same checkpoint.
        manifest, source = self._agree_manifest(step, remote)
        if manifest is None:
            return None
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
        # 3. Files no node holds intact: download them (only those).
        ok, now_here, source = self._fetch_lacking(step, manifest, report, held, remote, source)
        if not self._all_true(ok):
            return None
        # 4. What this rank reads from files that only other nodes hold comes
        #    from those nodes over the job's own network (at an unchanged
        #    layout: the few replicated items DCP wrote once for all ranks).
        return self._read_from_peers(step, manifest, reads, extra, now_here, source)

    def _agree_manifest(self, step: int, remote: dict[str, list[int]]) -> tuple[Manifest | None, str]:
        """Collective: this directory's manifest of ``step`` (None when some
        directory has none, or the directories hold different checkpoints)
        and where this rank's directory got it."""
        manifest, source = (None, "")
        if self.dir_leader:
            manifest, source = self._prepare(step, remote)
        heads = self._all_gather(manifest.to_json() if manifest is not None else None)
        leaders = [heads[r] for r in self._dir_leaders]
        if any(h is None for h in leaders):
            return None, source
        if len({Manifest.from_json(h).digest() for h in leaders}) > 1:
            if self.rank == 0:
                log.warning("checkpoint: the nodes hold different checkpoints of step %d", step)
            return None, source
        return Manifest.from_json(heads[self._my_dir_leader]), source

    def _fetch_lacking(
        self,
        step: int,
        manifest: Manifest,
        report: list[Any],
        held: list[str],
        remote: dict[str, list[int]],
        source: str,
    ) -> tuple[bool, list[str], str]:
        """Directory leaders download the files their ranks need that no node
        holds intact; returns (ok, the files now here, the source)."""
        if not self.dir_leader:
            return True, held, source
        held_by = {r: set(report[r][1]) for r in self._dir_leaders}
        here = held_by[self._my_dir_leader]
        elsewhere = {n for r, h in held_by.items() if r != self._my_dir_leader for n in h}
        ok, now_here = True, held
        lacking = sorted(
            n
            for n in {n for r in self._dir_ranks for n in report[r][0]} - here
            if n == DCP_METADATA or (n not in elsewhere and self._downloads(n, manifest, report))
        )
        if lacking:
            ok, fetched_from = self._download(step, manifest, lacking, remote)
            source = fetched_from or source
            now_here = sorted(set(held) | set(lacking))
        path = self._path(step)
        if ok and read_manifest(path) is None:
            write_manifest(path, manifest)
        return ok, now_here, source

    def _read_from_peers(
        self,
        step: int,
        manifest: Manifest,
        reads: dict[Any, Any] | None,
        extra: str,
        now_here: list[str],
        source: str,
    ) -> str | None:
        """Collective: the items this rank reads from files only other nodes
        hold, received from them (``self._remap`` says where they went)."""
        path = self._path(step)
        after = self._all_gather(now_here)
        held_by = {r: set(after[r]) for r in self._dir_leaders}
        here = held_by[self._my_dir_leader]
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
            states = {k: app_state[k] for k in DCP_KEYS if k in app_state}
            match_checkpoint(states, metadata)
            state = _stateful_to_state_dict(states)
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
        reader = _RemappedReader(path, self._remap)
        try:
            match_checkpoint(dcp_state, reader.read_metadata())
            dcp.load(
                dcp_state,
                storage_reader=reader,
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
        extra = load_extra(os.path.join(path, extra_file_name(src)))
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
