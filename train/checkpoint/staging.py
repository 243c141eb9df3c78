"""Staging for the checkpoint worker: the trainer copies its model and
optimizer tensors into CPU buffers in shared memory (allocated once, reused
by every save; pinned on GPU machines) and sends the worker the state's
structure, tensors replaced by references to those buffers
(:class:`Ref`, and :class:`ShardRef` for a DTensor's local shard plus the
chunk DCP would record for it, so the worker needs no device mesh);
:func:`resolve` puts the worker's view of the state back together.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Ref:
    """A plain tensor leaf: buffer ``i``."""

    i: int


@dataclasses.dataclass(frozen=True)
class ShardRef:
    """A DTensor leaf: buffer ``i`` holds its local shard; the rest is what
    DCP records for it (the chunk's place in the global tensor)."""

    i: int
    sizes: tuple[int, ...]
    offsets: tuple[int, ...]
    global_size: tuple[int, ...]
    properties: Any  # torch.distributed.checkpoint.metadata.TensorProperties


class Shard:
    """A DTensor's local shard without its mesh: DCP's _Checkpointable
    protocol gives the same write items DTensor itself would."""

    def __init__(self, local: Any, ref: ShardRef) -> None:
        self.local = local
        self.ref = ref

    def __create_write_items__(self, fqn: str, obj: Any) -> list[Any]:
        import torch
        from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex
        from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

        offsets, sizes = torch.Size(self.ref.offsets), torch.Size(self.ref.sizes)
        return [
            WriteItem(
                index=MetadataIndex(fqn, offsets),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(
                    chunk=ChunkStorageMetadata(offsets=offsets, sizes=sizes),
                    properties=self.ref.properties,
                    size=torch.Size(self.ref.global_size),
                ),
            )
        ]

    def __create_chunk_list__(self) -> list[Any]:
        import torch
        from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

        return [ChunkStorageMetadata(offsets=torch.Size(self.ref.offsets), sizes=torch.Size(self.ref.sizes))]

    def __get_tensor_shard__(self, index: Any) -> Any:
        return self.local


def skeleton(state: Any) -> tuple[Any, list[Any]]:
    """(the state with every tensor leaf replaced by a Ref / ShardRef, the
    leaves' local tensors in buffer order). Cheap: metadata only."""
    import torch
    from torch.distributed.checkpoint.metadata import TensorProperties
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    from torch.utils._pytree import tree_map

    locals_: list[Any] = []

    def one(x: Any) -> Any:
        if isinstance(x, DTensor):
            local = x._local_tensor
            sizes, offsets = compute_local_shape_and_global_offset(x.shape, x.device_mesh, x.placements)
            locals_.append(local)
            return ShardRef(
                len(locals_) - 1,
                tuple(sizes),
                tuple(offsets),
                tuple(x.size()),
                TensorProperties.create_from_tensor(local),
            )
        if isinstance(x, torch.Tensor):
            locals_.append(x)
            return Ref(len(locals_) - 1)
        return x

    return tree_map(one, state), locals_


class SharedStager:
    """CPU copies of the state's tensors in shared memory (pinned on GPU
    machines), allocated once and reused by every save: staging is one copy
    per tensor. New buffers only when the state's shapes change (e.g. the
    optimizer state appears after the first step); ``version`` says so."""

    def __init__(self, pin: bool) -> None:
        self.pin = pin
        self.buffers: list[Any] = []
        self.version = 0
        self._signature: Any = None

    def stage(self, live: Any) -> Any:
        """Copy ``live`` into the buffers; returns its skeleton."""
        skel, locals_ = skeleton(live)
        sig = [(tuple(t.shape), t.dtype) for t in locals_]
        if sig != self._signature:
            self.buffers = [self._alloc(t) for t in locals_]
            self._signature = sig
            self.version += 1
        # Asynchronous device-to-host copies into pinned memory: the caller
        # synchronizes its stream before the worker may read the buffers.
        for buf, t in zip(self.buffers, locals_, strict=True):
            buf.copy_(t.detach(), non_blocking=self.pin and t.device.type == "cuda")
        return skel

    def _alloc(self, t: Any) -> Any:
        import weakref

        import torch

        buf = torch.empty(tuple(t.shape), dtype=t.dtype).share_memory_()
        if self.pin and buf.numel() > 0:
            import torch.cuda._pin_memory_utils as pin_utils

            pin_utils.pin_memory(buf.data_ptr(), buf.numel() * buf.element_size())
            weakref.finalize(buf, pin_utils.unpin_memory, buf.data_ptr())
        return buf


def resolve(skel: Any, buffers: list[Any]) -> Any:
    from torch.utils._pytree import tree_map

    def one(x: Any) -> Any:
        if isinstance(x, ShardRef):
            return Shard(buffers[x.i], x)
        if isinstance(x, Ref):
            return buffers[x.i]
        return x

    return tree_map(one, skel)
