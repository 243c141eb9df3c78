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


# Byte alignment of each tensor in the staging arena (a cache line; enough
# for every dtype's view).
ARENA_ALIGN = 64


def _aligned(n: int) -> int:
    return -(-n // ARENA_ALIGN) * ARENA_ALIGN


class Arena:
    """The staging buffers of one rank: views into ONE shared-memory byte
    tensor, so staging holds one shared-memory segment (one file descriptor)
    however many tensors the state has. (One ``share_memory_()`` buffer per
    tensor held one descriptor each: an 8B model with AdamW is ~1,160
    tensors a rank, over a stock ``ulimit -n`` of 1024.) Pickled for the
    worker as the byte tensor plus each view's (offset, shape, dtype): one
    descriptor crosses the pipe, and the worker rebuilds the same views."""

    def __init__(self, storage: Any, layout: list[tuple[int, tuple[int, ...], Any]]) -> None:
        import math

        import torch

        self.storage = storage  # 1-D uint8 tensor in shared memory
        self.layout = layout
        # Each view gets a storage of exactly its own bytes (numpy slices of
        # the one mapping): DCP writes a tensor whose storage is larger than
        # itself by cloning it first, a second copy of every byte.
        whole = storage.numpy()
        self.views = [
            torch.from_numpy(whole[off : off + math.prod(shape) * dtype.itemsize]).view(dtype).view(shape)
            for off, shape, dtype in layout
        ]

    def __len__(self) -> int:
        return len(self.views)

    def __getitem__(self, i: int) -> Any:
        return self.views[i]

    def __iter__(self) -> Any:
        return iter(self.views)

    def __reduce__(self) -> Any:
        return (Arena, (self.storage, self.layout))


class SharedStager:
    """CPU copies of the state's tensors in shared memory (pinned on GPU
    machines), allocated once and reused by every save: staging is one copy
    per tensor. All copies live in one :class:`Arena` (one segment a rank,
    independent of the tensor count). A new arena only when the state's
    shapes change (e.g. the optimizer state appears after the first step);
    ``version`` says so."""

    def __init__(self, pin: bool) -> None:
        self.pin = pin
        self.buffers: Arena | list[Any] = []
        self.version = 0
        self._signature: Any = None

    def stage(self, live: Any) -> Any:
        """Copy ``live`` into the buffers; returns its skeleton."""
        skel, locals_ = skeleton(live)
        sig = [(tuple(t.shape), t.dtype) for t in locals_]
        if sig != self._signature:
            # The old arena's segment goes before the new one is made; a
            # failed allocation leaves no stale buffers behind.
            self.buffers, self._signature = [], None
            self.buffers = self._alloc(sig)
            self._signature = sig
            self.version += 1
        # Asynchronous device-to-host copies into pinned memory: the caller
        # synchronizes its stream before the worker may read the buffers.
        for buf, t in zip(self.buffers, locals_, strict=True):
            buf.copy_(t.detach(), non_blocking=self.pin and t.device.type == "cuda")
        return skel

    def _alloc(self, sig: list[tuple[tuple[int, ...], Any]]) -> Arena:
        import math
        import weakref

        import torch

        layout, off = [], 0
        for shape, dtype in sig:
            layout.append((off, shape, dtype))
            off += _aligned(math.prod(shape) * dtype.itemsize)
        storage = torch.empty(max(off, ARENA_ALIGN), dtype=torch.uint8).share_memory_()
        if self.pin:
            import torch.cuda._pin_memory_utils as pin_utils

            pin_utils.pin_memory(storage.data_ptr(), storage.numel())
            weakref.finalize(storage, pin_utils.unpin_memory, storage.data_ptr())
        return Arena(storage, layout)


def resolve(skel: Any, buffers: list[Any]) -> Any:
    from torch.utils._pytree import tree_map

    def one(x: Any) -> Any:
        if isinstance(x, ShardRef):
            return Shard(buffers[x.i], x)
        if isinstance(x, Ref):
            return buffers[x.i]
        return x

    return tree_map(one, skel)
