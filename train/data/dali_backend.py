"""DALI pipelines for one epoch segment (from a batch to the end of an epoch).

Sample order comes from :class:`SampleOrder`; DALI does the reading,
decoding and augmentation. On a GPU, images decode with ``device="mixed"``
(nvJPEG) and leave the pipeline normalized in fp16 on the device; on a CPU
the same graph uses CPU operators. DALI is imported only here.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from launcher.config.datasets import TokenShards
from train.data.images import MEAN_255, STD_255, ImageFolder, crop_params
from train.data.sharding import SampleOrder

PREFETCH_DEPTH = 2
REQUIRED_OPS = ("external_source", "cast", "resize", "crop_mirror_normalize")


def check_dali() -> str:
    """'' when DALI and the operators meshrun uses are present, else why not."""
    try:
        from nvidia.dali import fn
    except ImportError as e:  # also raised by a DALI build without its libraries
        return f"DALI is not installed ({e})"
    missing = [op for op in REQUIRED_OPS if not hasattr(fn, op)]
    missing += [f"readers.{op}" for op in ("file",) if not hasattr(fn.readers, op)]
    missing += [f"decoders.{op}" for op in ("image_slice",) if not hasattr(fn.decoders, op)]
    return f"DALI lacks the operators {', '.join(missing)}" if missing else ""


def _to_torch(tl, device: torch.device) -> torch.Tensor:
    """Copy a dense DALI TensorList into a new torch tensor on ``device``."""
    from nvidia.dali.plugin.pytorch import feed_ndarray, to_torch_type

    tensor = tl.as_tensor()
    out = torch.empty(tensor.shape(), dtype=to_torch_type[tensor.dtype], device=device)
    stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
    feed_ndarray(tensor, out, cuda_stream=stream)
    return out


def _device_id(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None  # CPU-only pipeline: DALI must not touch CUDA
    return device.index if device.index is not None else torch.cuda.current_device()


class _Segment:
    """Runs a built pipeline exactly ``n_batches`` times. Sources and readers
    past the end repeat (the reader wraps around); those prefetched extras are
    never returned."""

    def __init__(self, pipe, n_batches: int, device: torch.device) -> None:
        self.pipe, self.n_batches, self.device, self.done = pipe, n_batches, device, 0

    def __iter__(self) -> Iterator:
        return self

    def __next__(self):
        if self.done >= self.n_batches:
            raise StopIteration
        outs = self.pipe.run()
        self.done += 1
        return tuple(_to_torch(o, self.device) for o in outs)


class TokensDali:
    def __init__(
        self, shards: TokenShards, order: SampleOrder, device: torch.device, num_threads: int
    ) -> None:
        self.shards, self.order, self.device, self.num_threads = shards, order, device, max(1, num_threads)

    def open(self, epoch: int, first_batch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        from nvidia.dali import fn, pipeline_def, types

        order, shards = self.order, self.shards
        last = order.batches_per_epoch - 1

        def source(info):
            ids = order.rank_batch(epoch, min(first_batch + info.iteration, last))
            return [np.array(shards.window(int(i))) for i in ids]

        dali_dtype = types.UINT16 if shards.dtype == np.uint16 else types.UINT32
        device_id = _device_id(self.device)

        @pipeline_def(
            batch_size=order.sharding.batch_size,
            num_threads=self.num_threads,
            device_id=device_id,
            prefetch_queue_depth=PREFETCH_DEPTH,
        )
        def pipeline():
            tokens = fn.external_source(source=source, batch=True, batch_info=True, dtype=dali_dtype, ndim=1)
            if device_id is not None:
                tokens = tokens.gpu()  # the narrow dtype crosses PCIe, then widen
            return fn.cast(tokens, dtype=types.INT64)

        pipe = pipeline()
        pipe.build()
        for (windows,) in _Segment(pipe, order.batches_per_epoch - first_batch, self.device):
            yield windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


class ImagesDali:
    def __init__(
        self,
        folder: ImageFolder,
        order: SampleOrder,
        device: torch.device,
        num_threads: int,
        image_size: int,
        augment: bool,
        fp16: bool,
    ) -> None:
        self.folder, self.order, self.device = folder, order, device
        self.num_threads, self.image_size, self.augment, self.fp16 = (
            max(1, num_threads),
            image_size,
            augment,
            fp16,
        )

    def open_ids(self, epoch: int, batches: list[np.ndarray]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Decode the given per-batch sample ids (already free of known bad
        images) in order."""
        from nvidia.dali import fn, pipeline_def, types

        ids = np.concatenate(batches)
        files = [self.folder.files[i] for i in ids]
        labels = self.folder.labels[ids].tolist()
        anchor, shape, flip = crop_params(self.order.seed, epoch, ids, self.augment)
        b = self.order.sharding.batch_size
        n = len(batches)

        def source(info):
            k = min(info.iteration, n - 1) * b
            return anchor[k : k + b], shape[k : k + b], flip[k : k + b]

        device_id = _device_id(self.device)
        size = self.image_size

        @pipeline_def(
            batch_size=b,
            num_threads=self.num_threads,
            device_id=device_id,
            prefetch_queue_depth=PREFETCH_DEPTH,
        )
        def pipeline():
            jpegs, label = fn.readers.file(files=files, labels=labels, random_shuffle=False, name="reader")
            a, s, m = fn.external_source(source=source, batch=True, batch_info=True, num_outputs=3)
            # Decode only the crop (ROI decode), on the GPU when there is one.
            images = fn.decoders.image_slice(
                jpegs,
                a,
                s,
                device="mixed" if device_id is not None else "cpu",
                output_type=types.RGB,
                axis_names="HW",
            )
            images = fn.resize(images, size=[size, size], interp_type=types.INTERP_LINEAR, antialias=True)
            images = fn.crop_mirror_normalize(
                images,
                dtype=types.FLOAT16 if self.fp16 else types.FLOAT,
                output_layout="CHW",
                mean=list(MEAN_255),
                std=list(STD_255),
                mirror=m,
            )
            if device_id is not None:
                label = label.gpu()
            return images, fn.cast(label, dtype=types.INT64)

        pipe = pipeline()
        pipe.build()
        for images, label in _Segment(pipe, n, self.device):
            yield images, label.view(-1, 1)  # one position per sample (see train/models/vit.py)
