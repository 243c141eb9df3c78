"""Background upload of committed checkpoints to tier 2 / tier 3, one worker
thread per node.

Protocol (works across nodes, and across "nodes" that share one machine):
1. Each node uploads the files its ranks wrote (node 0 also DCP's
   ``.metadata``); every object is verified (size + sha256 for a directory
   store; for S3 the object is read back and hashed against the manifest's
   digest, never trusting a checksum the store echoes). Objects
   already present and verified are skipped, so a restarted upload resumes.
2. The node then writes its marker ``step_<N>/_nodes/node_<k>.json``.
   Markers live in the store itself, not in a collective: uploads outlive
   outages and restarts, and a background thread must not hold a collective
   open while S3 is down.
3. Node 0 waits until every node's marker is there, then uploads
   ``manifest.json`` last: only then does the remote copy exist for resume.
   Files live under a generation named by the manifest's digest
   (``step_<N>/g<digest16>/``), so a re-save of a step that exists remotely
   never overwrites the old copy's objects: at every instant the manifest
   points at a complete copy (the old one until the new manifest replaces
   it). Node 0 then deletes the other generations' objects and applies
   remote retention. A node whose marker does not come
   within ``marker_timeout_s`` ends that step's upload with an error naming
   the nodes; the step stays uncommitted remotely and its local copies are
   kept (until a newer step is uploaded).
4. The local copy is marked ``.uploaded-<tier>`` (``.node-uploaded-<tier>``
   on other nodes); it is never deleted by the upload.

Failures (S3 down, timeouts) are retried with exponential backoff forever;
training is never blocked. If a newer checkpoint is committed meanwhile, the
worker moves on to it (the older one is superseded).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from train.checkpoint.manifest import MANIFEST, Manifest, read_manifest, step_dir_name
from train.checkpoint.retention import prune_store
from train.checkpoint.store import NODES_DIR, Store, node_marker_name

log = logging.getLogger("meshrun.checkpoint")


class Superseded(Exception):
    """A newer checkpoint is waiting; abandon this one."""


class MarkerTimeout(Exception):
    """Other nodes' parts did not arrive in time; give this step up."""


def uploaded_marker(tier: str, node: int) -> str:
    return f".uploaded-{tier}" if node == 0 else f".node-uploaded-{tier}"


def is_uploaded(local_dir: str | os.PathLike[str], tier: str, node: int) -> bool:
    return (Path(local_dir) / uploaded_marker(tier, node)).exists()


class Uploader:
    """One per node (run by the node's lowest rank)."""

    def __init__(
        self,
        local_root: str,
        stores: list[Store],
        *,
        node: int,
        keep_remote: int,
        retry_max_s: float = 60.0,
        poll_s: float = 0.5,
        marker_timeout_s: float = 600.0,
        on_uploaded: Callable[[float], None] | None = None,
    ):
        self.local_root = local_root
        self.stores = stores
        self.node = node
        self.keep_remote = keep_remote
        self.retry_max_s = retry_max_s
        self.poll_s = poll_s
        self.marker_timeout_s = marker_timeout_s
        # Steps whose remote commit was given up (missing nodes): kept locally.
        self.abandoned: set[int] = set()
        self._cv = threading.Condition()
        self._pending: set[int] = set()
        self._manifests: dict[int, Manifest] = {}
        self._active: int | None = None
        self._closing = False
        # store.name -> newest step this node finished there (manifest on node 0).
        self.done: dict[str, int] = {}
        self.bytes_uploaded = 0
        self.upload_seconds = 0.0
        self.failures = 0
        # Seconds from a step's commit (submit) to its verified upload, newest.
        self.last_lag_s: float | None = None
        self._on_uploaded = on_uploaded  # called with that lag
        self._submitted: dict[int, float] = {}
        # store.name -> (first failure, failed attempts, last warning) during an outage.
        self._outage: dict[str, tuple[float, int, float]] = {}
        self._thread = threading.Thread(target=self._run, name="ckpt-upload", daemon=True)
        self._thread.start()

    # -- API used by the manager (training thread) ---------------------------
    def submit(self, step: int, manifest: Manifest | None = None) -> None:
        """Queue a committed step. Pass its manifest when this node's copy of
        the manifest file may not be written yet (another rank writes it)."""
        with self._cv:
            if manifest is not None:
                self._manifests[step] = manifest
            self._pending.add(step)
            self._submitted.setdefault(step, time.monotonic())
            self._cv.notify_all()

    def protected(self) -> set[int]:
        """Steps that local retention must keep (queued or in flight)."""
        with self._cv:
            active = {self._active} if self._active is not None else set()
            return set(self._pending) | active | self.abandoned

    def idle(self) -> bool:
        with self._cv:
            return not self._pending and self._active is None

    def wait(self, timeout_s: float) -> bool:
        """Wait until nothing is queued or in flight; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while self._pending or self._active is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(min(left, 0.5))
        return True

    def close(self) -> None:
        with self._cv:
            self._closing = True
            self._cv.notify_all()

    # -- worker thread --------------------------------------------------------
    def _newer_pending(self, step: int) -> bool:
        with self._cv:
            return any(s > step for s in self._pending)

    def _sleep(self, seconds: float) -> None:
        """Interruptible by submit() / close()."""
        with self._cv:
            self._cv.wait(seconds)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._pending and not self._closing:
                    self._cv.wait()
                if not self._pending:
                    return
                step = max(self._pending)
                older = sorted(s for s in self._pending if s < step)
                self._pending.clear()
                self._active = step
                manifest = self._manifests.get(step)
                self._manifests = {s: m for s, m in self._manifests.items() if s > step}
            if older:
                log.info("checkpoint: upload of steps %s superseded by step %d", older, step)
            try:
                self._upload_step(step, manifest)
            except Superseded:
                log.info("checkpoint: upload of step %d superseded by a newer checkpoint", step)
            except MarkerTimeout as e:
                with self._cv:
                    self.abandoned.add(step)
                log.error("checkpoint: %s", e)
            except Exception:  # never kill the worker: training must go on
                log.exception("checkpoint: upload of step %d failed unexpectedly; local copy kept", step)
            finally:
                with self._cv:
                    self._active = None
                    self._cv.notify_all()

    def _upload_step(self, step: int, manifest: Manifest | None) -> None:
        local = os.path.join(self.local_root, step_dir_name(step))
        manifest = manifest or read_manifest(local)
        if manifest is None:
            log.warning("checkpoint: step %d vanished from %s before upload", step, local)
            return
        for store in self.stores:
            if is_uploaded(local, store.tier, self.node):
                continue
            attempt = 0
            while True:
                try:
                    self._upload_to(store, step, local, manifest)
                    outage = self._outage.pop(store.name, None)
                    if outage is not None:
                        log.warning(
                            "checkpoint: %s reachable again: step %d uploaded after %d failed attempts "
                            "(%.0f s)",
                            store.name,
                            step,
                            outage[1],
                            time.monotonic() - outage[0],
                        )
                    break
                except (Superseded, MarkerTimeout):
                    raise
                except Exception as e:
                    attempt += 1
                    self.failures += 1
                    now = time.monotonic()
                    first, count, last_warn = self._outage.get(store.name, (now, 0, 0.0))
                    delay = min(self.retry_max_s, 0.5 * 2 ** min(attempt, 16))
                    warn = count == 0 or now - last_warn >= 60
                    self._outage[store.name] = (first, count + 1, now if warn else last_warn)
                    if warn:
                        log.warning(
                            "checkpoint: upload of step %d to %s failed (attempt %d: %s: %s); "
                            "training continues, local copy kept at %s; retrying in %.1f s",
                            step,
                            store.name,
                            count + 1,
                            type(e).__name__,
                            str(e).splitlines()[0][:300] if str(e) else "",
                            local,
                            delay,
                        )
                    self._sleep(delay)
                    if self._newer_pending(step):
                        raise Superseded() from e
                    if not os.path.isdir(local):
                        log.warning("checkpoint: step %d removed locally; giving up its upload", step)
                        return

    def _upload_to(self, store: Store, step: int, local: str, manifest: Manifest) -> None:
        t0 = time.monotonic()
        digest = manifest.digest()
        remote = store.read_manifest(step)
        nbytes = 0
        if remote is None or remote.digest() != digest:
            if remote is not None:
                # A different checkpoint of the same step (saved after a resume
                # from an older one). Its files go to their own generation;
                # the old copy stays complete until the manifest is switched.
                log.info("checkpoint: replacing an older copy of step %d in %s", step, store.name)
            names = manifest.node_files(self.node)
            nbytes = store.put_files(step, local, names, manifest)
            marker = {"node": self.node, "digest": digest, "files": names, "time": time.time()}
            store.put_bytes(step, node_marker_name(self.node), json.dumps(marker).encode())
            if self.node == 0:
                self._wait_for_nodes(store, step, manifest.num_nodes, digest)
                store.put_bytes(step, MANIFEST, manifest.to_json().encode())
                back = store.read_manifest(step)
                if back is None or back.digest() != digest:
                    raise RuntimeError(f"{store.name}: manifest of step {step} did not read back")
        if self.node == 0:
            # Only now, with the manifest pointing at the new generation, do
            # the old generation's objects (and any uncommitted ones) go.
            stale = store.stale_names(step, manifest)
            if stale:
                store.delete_names(step, stale)
                log.info(
                    "checkpoint: removed %d objects of older copies of step %d from %s",
                    len(stale),
                    step,
                    store.name,
                )
        elapsed = time.monotonic() - t0
        with self._cv:
            self.abandoned = {s for s in self.abandoned if s > step}
        self.bytes_uploaded += nbytes
        self.upload_seconds += elapsed
        self.done[store.name] = step
        if step in self._submitted:
            self.last_lag_s = time.monotonic() - self._submitted[step]
            if self._on_uploaded is not None:
                self._on_uploaded(self.last_lag_s)
        Path(local, uploaded_marker(store.tier, self.node)).touch()
        log.info(
            "checkpoint: step %d %s to %s (%.1f MB in %.2f s, %.1f MB/s)",
            step,
            "committed" if self.node == 0 else f"node {self.node} files uploaded",
            store.name,
            nbytes / 1e6,
            elapsed,
            nbytes / 1e6 / max(elapsed, 1e-9),
        )
        if self.node == 0:
            prune_store(store, self.keep_remote, protected=self.protected())

    def _wait_for_nodes(self, store: Store, step: int, num_nodes: int, digest: str) -> None:
        """Every node's marker, for this very checkpoint (same digest)."""
        waiting = set(range(num_nodes))
        deadline = time.monotonic() + self.marker_timeout_s
        while True:
            present = set(store.list_names(step, NODES_DIR + "/"))
            for k in sorted(waiting):
                if node_marker_name(k) in present:
                    data = store.get_bytes(step, node_marker_name(k))
                    if data is not None and json.loads(data).get("digest") == digest:
                        waiting.discard(k)
            if not waiting:
                return
            if self._newer_pending(step):
                raise Superseded()
            if time.monotonic() >= deadline:
                raise MarkerTimeout(
                    f"step {step} is not committed to {store.name}: node(s) {sorted(waiting)} did not upload "
                    f"their part within {self.marker_timeout_s:.0f} s (storage.upload_marker_timeout_s); "
                    f"the local copies are kept in {self.local_root}/{step_dir_name(step)} on every node"
                )
            self._sleep(self.poll_s)
