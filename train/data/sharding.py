"""Which samples a data-parallel rank reads, and in what order.

Pure numpy, shared by the DALI pipelines and the torch fallback so both
produce the same sample sequence. Positions are kept in global terms (epoch,
batch within the epoch): every rank holds the same loader state, so a
checkpoint's single copy restores all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from launcher.config.plandata import Plan
from launcher.config.validate import ConfigError

_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def dp_coords(rank: int, plan: Plan) -> tuple[int, int]:
    """(data-parallel rank, data-parallel size) of a global rank.

    Mesh order is (pp, dp_replicate, dp_shard, tp) with tp innermost, so the
    tp and pp peers of one replica share a dp rank and read the same batches.
    """
    tp, dp_shard, dp_rep = plan.tp, plan.dp_shard, plan.dp_replicate
    assert 0 <= rank < plan.world_size, (rank, plan.world_size)
    shard_idx = (rank // tp) % dp_shard
    rep_idx = (rank // (tp * dp_shard)) % dp_rep
    return rep_idx * dp_shard + shard_idx, dp_rep * dp_shard


@dataclass(frozen=True)
class Sharding:
    dp_rank: int
    dp_size: int
    batch_size: int  # samples per item for this rank (one optimizer step)

    @property
    def global_batch(self) -> int:
        return self.dp_size * self.batch_size


class SampleOrder:
    """Epoch permutations of ``num_samples`` sample ids, cut into global
    batches (the tail that does not fill one is dropped each epoch); rank r
    takes slice r of every global batch, so ranks are disjoint and together
    cover each epoch's batches completely."""

    def __init__(self, num_samples: int, sharding: Sharding, seed: int, shuffle: bool) -> None:
        self.num_samples = num_samples
        self.sharding = sharding
        self.seed = seed
        self.shuffle = shuffle
        self.batches_per_epoch = num_samples // sharding.global_batch
        if self.batches_per_epoch == 0:
            raise ConfigError(
                f"data: {num_samples} samples cannot fill one global batch of {sharding.global_batch} "
                f"({sharding.dp_size} data-parallel ranks x {sharding.batch_size}): "
                "add data or lower train.global_batch_size"
            )
        self._cached: tuple[int, np.ndarray] | None = None

    def epoch_order(self, epoch: int) -> np.ndarray:
        if self._cached is not None and self._cached[0] == epoch:
            return self._cached[1]
        if self.shuffle:
            order = np.random.Generator(np.random.PCG64([self.seed, epoch])).permutation(self.num_samples)
        else:
            order = np.arange(self.num_samples)
        if self.num_samples < 2**31:
            order = order.astype(np.int32)  # half the memory for large corpora
        self._cached = (epoch, order)
        return order

    def rank_batch(self, epoch: int, batch: int) -> np.ndarray:
        """Sample ids of this rank's ``batch``-th item in ``epoch``."""
        assert 0 <= batch < self.batches_per_epoch, (batch, self.batches_per_epoch)
        s = self.sharding
        start = batch * s.global_batch + s.dp_rank * s.batch_size
        return self.epoch_order(epoch)[start : start + s.batch_size]


def hash_uniform(seed: int, epoch: int, ids: np.ndarray, stream: int) -> np.ndarray:
    """Uniform [0, 1) floats that depend only on (seed, epoch, sample id,
    stream): augmentation is the same whatever the batch, rank count, backend
    or resume point (splitmix64 finalizer; uint64 arithmetic wraps)."""
    key = (seed * 0x9E3779B1 + epoch * 0x85EBCA77 + stream * 0xC2B2AE3D) & 0xFFFFFFFFFFFFFFFF
    with np.errstate(over="ignore"):
        z = (ids.astype(np.uint64) + np.uint64(key)) * np.uint64(0x9E3779B97F4A7C15) & _MASK64
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9) & _MASK64
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB) & _MASK64
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)
