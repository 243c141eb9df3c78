"""An image folder (one sub-folder per class), augmentation parameters and
the PIL decode used by the fallback loader and to find images that fail to
decode.

Augmentation (random resized crop + horizontal flip) is drawn per sample from
(seed, epoch, sample id), not from a pipeline RNG: DALI and the fallback crop
the same regions, and a resumed run augments exactly as an uninterrupted one.
Crop scale and aspect ratio are relative to the image, so no image sizes
need to be read before training.
"""

from __future__ import annotations

import math

import numpy as np

from launcher.config.datasets import EXTENSIONS, ImageFolder, scan_folder  # noqa: F401 (train.data.images API)
from launcher.config.validate import ConfigError
from train.data.sharding import hash_uniform

# ImageNet statistics on the 0-255 scale of decoded pixels (the seed article
# passed 0-1 values to 0-255 images).
MEAN_255 = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STD_255 = (0.229 * 255, 0.224 * 255, 0.225 * 255)
SCALE = (0.08, 1.0)
LOG_RATIO = (math.log(3 / 4), math.log(4 / 3))


def crop_params(
    seed: int, epoch: int, ids: np.ndarray, augment: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per sample: relative anchor (y, x), relative shape (h, w) as float32
    [n, 2] and a horizontal flip flag int32 [n]."""
    n = len(ids)
    if not augment:
        return np.zeros((n, 2), np.float32), np.ones((n, 2), np.float32), np.zeros(n, np.int32)
    u = [hash_uniform(seed, epoch, ids, stream) for stream in range(5)]
    scale = SCALE[0] + (SCALE[1] - SCALE[0]) * u[0]
    ratio = np.exp(LOG_RATIO[0] + (LOG_RATIO[1] - LOG_RATIO[0]) * u[1])
    w = np.minimum(np.sqrt(scale * ratio), 1.0)
    h = np.minimum(np.sqrt(scale / ratio), 1.0)
    y = (1.0 - h) * u[2]
    x = (1.0 - w) * u[3]
    anchor = np.stack([y, x], axis=1).astype(np.float32)
    shape = np.stack([h, w], axis=1).astype(np.float32)
    return anchor, shape, (u[4] < 0.5).astype(np.int32)


def decode_pil(path: str, anchor: np.ndarray, shape: np.ndarray, flip: int, size: int) -> np.ndarray:
    """Decode, crop, resize to size x size, flip, normalize: CHW float32.
    Raises OSError / ValueError for an image that cannot be decoded."""
    from PIL import Image

    with Image.open(path) as im:
        im = im.convert("RGB")
        width, height = im.size
        box = (
            float(anchor[1]) * width,
            float(anchor[0]) * height,
            float(anchor[1] + shape[1]) * width,
            float(anchor[0] + shape[0]) * height,
        )
        im = im.resize((size, size), Image.BILINEAR, box=box)
    arr = np.asarray(im, dtype=np.float32)
    if flip:
        arr = arr[:, ::-1]
    arr = (arr - np.asarray(MEAN_255, np.float32)) / np.asarray(STD_255, np.float32)
    return np.ascontiguousarray(arr.transpose(2, 0, 1))


def decodes(path: str) -> bool:
    """Whether PIL decodes the whole file (used to find a bad image in a batch
    DALI refused)."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            im.load()
        return True
    except (OSError, ValueError, SyntaxError):
        return False


def substitute_bad(ids: np.ndarray, bad: np.ndarray) -> np.ndarray:
    """Replace bad samples of a batch by the nearest good one before them
    (after them for a leading run): batch sizes stay equal on every rank."""
    if not bad.any():
        return ids
    good = np.flatnonzero(~bad)
    if good.size == 0:
        raise ConfigError(f"data: every image of a batch failed to decode (sample ids {ids.tolist()})")
    out = ids.copy()
    for i in np.flatnonzero(bad):
        before = good[good < i]
        out[i] = ids[before[-1]] if before.size else ids[good[0]]
    return out
