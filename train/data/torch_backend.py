"""The fallback without DALI: a torch DataLoader over the same sample order
(one dataset item = one rank batch), so it yields what DALI yields."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from launcher.config.datasets import TokenShards
from train.data.images import ImageFolder, crop_params, decode_pil, substitute_bad
from train.data.sharding import SampleOrder


class _TokenBatches(Dataset):
    def __init__(self, shards: TokenShards, order: SampleOrder, epoch: int, first_batch: int) -> None:
        self.shards, self.order, self.epoch, self.first_batch = shards, order, epoch, first_batch

    def __len__(self) -> int:
        return self.order.batches_per_epoch - self.first_batch

    def __getitem__(self, i: int) -> torch.Tensor:
        ids = self.order.rank_batch(self.epoch, self.first_batch + i)
        return torch.from_numpy(self.shards.batch(ids))


class _ImageBatches(Dataset):
    def __init__(
        self, folder: ImageFolder, batches: list[np.ndarray], seed: int, epoch: int, size: int, augment: bool
    ) -> None:
        self.folder, self.batches, self.seed, self.epoch = folder, batches, seed, epoch
        self.size, self.augment = size, augment

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        ids = self.batches[i]
        anchor, shape, flip = crop_params(self.seed, self.epoch, ids, self.augment)
        images: list[np.ndarray | None] = []
        for j, sample in enumerate(ids):
            try:
                images.append(decode_pil(self.folder.files[sample], anchor[j], shape[j], flip[j], self.size))
            except (OSError, ValueError, SyntaxError):
                images.append(None)
        bad = np.array([im is None for im in images])
        # Same substitution as the DALI path: a bad image's slot repeats its
        # neighbour (identical crop, since parameters follow the sample id).
        used = substitute_bad(ids, bad)
        for j in np.flatnonzero(bad):
            images[j] = images[int(np.flatnonzero(ids == used[j])[0])]
        return (
            torch.from_numpy(np.stack(images)),
            torch.from_numpy(self.folder.labels[used]).view(-1, 1),
            ids[bad].tolist(),
        )


def _loader(dataset: Dataset, num_workers: int, pin: bool) -> DataLoader:
    return DataLoader(
        dataset,
        batch_size=None,  # items are whole batches
        shuffle=False,
        num_workers=num_workers,
        pin_memory=pin,
        prefetch_factor=2 if num_workers else None,
    )


class TokensTorch:
    def __init__(
        self, shards: TokenShards, order: SampleOrder, device: torch.device, num_workers: int
    ) -> None:
        self.shards, self.order, self.device, self.num_workers = shards, order, device, num_workers

    def open(self, epoch: int, first_batch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        data = _TokenBatches(self.shards, self.order, epoch, first_batch)
        for windows in _loader(data, self.num_workers, self.device.type == "cuda"):
            windows = windows.to(self.device, non_blocking=True)
            yield windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


class ImagesTorch:
    def __init__(
        self,
        folder: ImageFolder,
        order: SampleOrder,
        device: torch.device,
        num_workers: int,
        image_size: int,
        augment: bool,
        fp16: bool,
    ) -> None:
        self.folder, self.order, self.device, self.num_workers = folder, order, device, num_workers
        self.image_size, self.augment, self.fp16 = image_size, augment, fp16
        self.found_bad: list[int] = []  # decode failures reported by workers

    def open_ids(self, epoch: int, batches: list[np.ndarray]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        data = _ImageBatches(self.folder, batches, self.order.seed, epoch, self.image_size, self.augment)
        for images, labels, bad in _loader(data, self.num_workers, self.device.type == "cuda"):
            self.found_bad.extend(bad)
            images = images.to(self.device, non_blocking=True)
            yield (images.half() if self.fp16 else images), labels.to(self.device, non_blocking=True)
