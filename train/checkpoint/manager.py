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

from typing import Any

from train.checkpoint.resume import ResumePath
from train.checkpoint.saving import SavePath
from train.checkpoint.store import Store

__all__ = ["CheckpointManager"]


class CheckpointManager(SavePath, ResumePath):
    """Tiered, asynchronous checkpoints of one rank. The tier wiring is in
    :mod:`train.checkpoint.wiring`, the save path in
    :mod:`train.checkpoint.saving`, the resume path in
    :mod:`train.checkpoint.resume`."""

    def __init__(
        self, spec: Any, dist_info: Any, *, stores: list[Store] | None = None, deferred_worker: bool = False
    ) -> None:
        """``deferred_worker`` (an in-process recovery's rebuild): the worker
        spawns at SCHED_IDLE, at :meth:`start_worker` or its first message,
        not here (its start stalled the first resumed step)."""
        self._wire(spec, dist_info, stores, deferred_worker)
        self._init_save_state()
        self._remap: dict[Any, Any] = {}
