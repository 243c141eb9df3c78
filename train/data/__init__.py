"""Data loaders: pretokenized token shards and image folders, read by NVIDIA
DALI when it is installed (a torch DataLoader with the same sample order
otherwise), sharded by data-parallel rank and resumable mid-epoch.

``build_loader(spec, dist_info)`` is the trainer's entry point
(docs/CONTRACTS.md); ``data=synthetic`` is the trainer's own loader.
``check_data(cfg)`` validates the files without torch, so a launcher can
fail before starting any rank. torch is imported only by ``build_loader``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from launcher.config.datasets import check_data
from train.data.sharding import SampleOrder, Sharding, dp_coords

if TYPE_CHECKING:
    from launcher.config.spec import RunSpec
    from train.data.loader import Loader

log = logging.getLogger("meshrun.data")

__all__ = ["build_loader", "check_data", "dp_coords"]


def build_loader(spec: RunSpec, dist_info) -> Loader:
    """Check the data (clear errors before training) and return this rank's
    loader. ``dist_info``: ``train.parallel.dist.DistInfo`` (rank and device)."""
    import torch

    from train.data.dali_backend import check_dali
    from train.data.loader import BadSamples, ImageSource, Loader

    cfg, plan = spec.cfg, spec.plan
    d, m = cfg.data, cfg.model
    if d.kind not in ("tokens", "images"):
        raise ValueError(
            f"data.kind={d.kind!r}: build_loader reads tokens or images (synthetic is the trainer's)"
        )
    dp_rank, dp_size = dp_coords(dist_info.rank, plan)
    if getattr(dist_info, "dp_size", 1) > 1:
        assert (dist_info.dp_rank, dist_info.dp_size) == (dp_rank, dp_size), (
            "mesh and plan disagree on dp rank"
        )
    sharding = Sharding(dp_rank, dp_size, plan.global_batch_size // plan.dp)
    device = torch.device(dist_info.device)
    verbose = dist_info.rank == 0

    use_dali = d.use_dali
    if use_dali:
        why = check_dali()
        if why:
            use_dali = False
            if verbose:
                log.warning("data: %s; using the torch DataLoader fallback (same samples, same order)", why)
    backend = "dali" if use_dali else "torch"

    if d.kind == "tokens":
        from launcher.config.datasets import TokenShards

        shards = TokenShards(d.path, m.seq_len, m.vocab_size)
        order = SampleOrder(len(shards), sharding, cfg.train.seed, d.shuffle)
        if use_dali:
            from train.data.dali_backend import TokensDali

            source = TokensDali(shards, order, device, d.num_workers)
        else:
            from train.data.torch_backend import TokensTorch

            source = TokensTorch(shards, order, device, d.num_workers)
        return Loader("tokens", source, order, backend)

    from train.data.images import scan_folder

    folder = scan_folder(d.path, m.num_classes)
    bad = BadSamples(d.on_bad_sample, d.bad_sample_limit, folder, verbose)
    bad.record(folder.rejected)
    order = SampleOrder(len(folder.files), sharding, cfg.train.seed, d.shuffle)
    fp16 = d.image_dtype == "fp16" or (d.image_dtype == "auto" and device.type == "cuda")
    args = (folder, order, device, d.num_workers, m.image_size, d.augment, fp16)
    if use_dali:
        from train.data.dali_backend import ImagesDali

        image_backend = ImagesDali(*args)
    else:
        from train.data.torch_backend import ImagesTorch

        image_backend = ImagesTorch(*args)
    loader = Loader("images", ImageSource(image_backend, order, bad, use_dali), order, backend)
    loader.bad_samples = bad
    return loader
