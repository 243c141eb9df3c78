"""The loader the trainer iterates: position keeping, resume, wait timing and
bad-image handling around a DALI or torch backend."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np
import torch

from launcher.config.validate import ConfigError
from train.data.images import ImageFolder, decodes, substitute_bad
from train.data.sharding import SampleOrder

log = logging.getLogger("meshrun.data")


class Source(Protocol):
    def open(self, epoch: int, first_batch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...


class BadSamples:
    """Images that cannot be used: counted, warned about and skipped, or the
    run fails (data.on_bad_sample=fail, or more than data.bad_sample_limit)."""

    def __init__(self, policy: str, limit: int, folder: ImageFolder, verbose: bool) -> None:
        self.policy, self.limit, self.folder, self.verbose = policy, limit, folder, verbose
        self.ids: set[int] = set()  # sample ids known not to decode
        self.count = 0

    def record(self, items: list[tuple[str, str]]) -> None:
        for path, why in items:
            self.count += 1
            if self.policy == "fail":
                raise ConfigError(f"data: image {path} is unusable ({why}) and data.on_bad_sample='fail'")
            if self.verbose:
                log.warning("data: skipping image %s (%s); %d skipped so far", path, why, self.count)
        if self.count > self.limit:
            raise ConfigError(
                f"data.bad_sample_limit={self.limit} is exceeded: {self.count} unusable images "
                f"(last: {items[-1][0]}); check data.path={self.folder.root!r}"
            )

    def record_ids(self, ids: list[int], why: str) -> None:
        new = [i for i in ids if i not in self.ids]
        self.ids.update(new)
        self.record([(self.folder.files[i], why) for i in new])

    def clean(self, ids: np.ndarray) -> np.ndarray:
        if not self.ids:
            return ids
        return substitute_bad(ids, np.isin(ids, list(self.ids)))


class ImageSource:
    """Epoch segments of an image backend with known bad images replaced;
    a DALI decode error finds the culprit(s), records them and restarts the
    segment at the batch that failed."""

    def __init__(self, backend: Any, order: SampleOrder, bad: BadSamples, dali: bool) -> None:
        self.backend, self.order, self.bad, self.dali = backend, order, bad, dali

    def open(self, epoch: int, first_batch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        from train.data.dali_backend import PREFETCH_DEPTH

        k = first_batch
        while k < self.order.batches_per_epoch:
            start = k
            batches = [
                self.bad.clean(self.order.rank_batch(epoch, j))
                for j in range(k, self.order.batches_per_epoch)
            ]
            try:
                for out in self.backend.open_ids(epoch, batches):
                    if not self.dali and self.backend.found_bad:
                        self.bad.record_ids(self.backend.found_bad, "failed to decode")
                        self.backend.found_bad.clear()
                    yield out
                    k += 1
                return
            except RuntimeError as e:
                if not self.dali:
                    raise
                # The failing batch is the next one or a prefetched one after it.
                suspects = np.unique(np.concatenate(batches[k - start : k - start + PREFETCH_DEPTH + 2]))
                found = [int(i) for i in suspects if not decodes(self.bad.folder.files[i])]
                if not found:
                    raise
                log.debug("DALI error %s", e)
                self.bad.record_ids(found, "failed to decode")


class Loader:
    """Iterator of (inputs, targets) on the rank's device: one item is one
    optimizer step's batch for this data-parallel rank."""

    def __init__(self, kind: str, source: Source, order: SampleOrder, backend: str) -> None:
        self.kind, self.source, self.order, self.backend = kind, source, order, backend
        self.epoch = 0
        self.batch = 0  # next batch within the epoch
        self.last_wait_s = 0.0
        self.bad_samples: BadSamples | None = None
        self._it: Iterator | None = None

    @property
    def batch_size(self) -> int:
        return self.order.sharding.batch_size

    def __iter__(self) -> Loader:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        t0 = time.perf_counter()
        if self._it is None:
            self._it = self.source.open(self.epoch, self.batch)
        out = next(self._it)
        self.batch += 1
        if self.batch == self.order.batches_per_epoch:
            self.epoch, self.batch = self.epoch + 1, 0
            self.close()
        self.last_wait_s = time.perf_counter() - t0
        return out

    def state_dict(self) -> dict[str, Any]:
        # Global terms only: identical on every rank.
        return {
            "kind": self.kind,
            "epoch": self.epoch,
            "batch": self.batch,
            "num_samples": self.order.num_samples,
            "global_batch": self.order.sharding.global_batch,
            "seed": self.order.seed,
            "shuffle": self.order.shuffle,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mine = self.state_dict()
        for key in ("kind", "num_samples", "global_batch", "seed", "shuffle"):
            if state.get(key) != mine[key]:
                raise ConfigError(
                    f"data: the checkpoint's loader has {key}={state.get(key)!r} but this run has "
                    f"{key}={mine[key]!r}; resuming would not continue the same sample sequence"
                )
        self.close()
        self.epoch, self.batch = int(state["epoch"]), int(state["batch"])

    def close(self) -> None:
        if self._it is not None:
            close = getattr(self._it, "close", None)
            if close:
                close()
            self._it = None
