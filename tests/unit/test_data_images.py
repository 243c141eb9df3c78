"""Image loader on small JPEG sets generated here: coverage across ranks,
DALI vs the PIL fallback, resume, and images that fail to decode."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from harness import write_images

from launcher.config.schema import RunConfig
from launcher.config.spec import RunSpec
from launcher.config.validate import ConfigError
from launcher.plan.make import make_plan
from train.data import build_loader
from train.data.dali_backend import check_dali
from train.parallel.dist import DistInfo

HAVE_DALI = check_dali() == ""
BACKENDS = [
    pytest.param(True, id="dali", marks=pytest.mark.skipif(not HAVE_DALI, reason=check_dali())),
    False,
]
SIZE = 32


def make_spec(path, *, ranks=2, use_dali=True, augment=True, gbs=8, policy="skip", limit=100) -> RunSpec:
    cfg = RunConfig()
    cfg.cluster.local_processes = ranks
    cfg.model.family, cfg.model.image_size, cfg.model.patch_size, cfg.model.num_classes = "vit", SIZE, 8, 10
    cfg.train.global_batch_size = gbs
    d = cfg.data
    d.kind, d.name, d.path, d.use_dali, d.augment, d.num_workers = (
        "images",
        "images",
        str(path),
        use_dali,
        augment,
        0,
    )
    d.on_bad_sample, d.bad_sample_limit = policy, limit
    return RunSpec(cfg, make_plan(cfg), str(path))


def loader(spec: RunSpec, rank: int = 0):
    return build_loader(spec, DistInfo(rank, spec.plan.world_size, rank, 2, 0, "cpu", "gloo", "127.0.0.1", 0))


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("images")
    write_images(root)
    return root


def take(it, n):
    return [next(it) for _ in range(n)]


@pytest.mark.parametrize("use_dali", BACKENDS)
def test_batches_disjoint_and_complete_across_ranks(folder, use_dali):
    # Without augmentation each sample is its whole image, so (label, pixels)
    # identify it.
    spec = make_spec(folder, ranks=4, use_dali=use_dali, augment=False)
    bpe = loader(spec).order.batches_per_epoch
    keys = []
    for rank in range(4):
        for images, labels in take(loader(spec, rank), bpe):
            assert images.shape == (2, 3, SIZE, SIZE) and images.dtype == torch.float32
            keys += [
                (int(lab), round(float(img[1].mean()), 3)) for img, lab in zip(images, labels, strict=True)
            ]
    assert len(keys) == len(set(keys)) == bpe * 8 == 32  # 36 images, a tail of 4 dropped


@pytest.mark.skipif(not HAVE_DALI, reason=check_dali())
@pytest.mark.parametrize("augment", [True, False])
def test_dali_matches_the_pil_fallback(folder, augment):
    a = take(loader(make_spec(folder, use_dali=True, augment=augment), 1), 6)
    b = take(loader(make_spec(folder, use_dali=False, augment=augment), 1), 6)
    for (xa, la), (xb, lb) in zip(a, b, strict=True):
        assert torch.equal(la, lb)
        # Same crop and flip; the resize kernels differ slightly.
        assert (xa - xb).abs().mean() < 0.05 * xb.abs().mean()


@pytest.mark.parametrize("use_dali", BACKENDS)
def test_resume_mid_epoch(folder, use_dali):
    spec = make_spec(folder, use_dali=use_dali)
    straight = take(loader(spec, 1), 7)  # 4 batches per epoch: crosses one
    first = loader(spec, 1)
    head = take(first, 3)
    resumed = loader(spec, 1)
    resumed.load_state_dict(first.state_dict())
    got = head + take(resumed, 4)
    for (xa, la), (xb, lb) in zip(got, straight, strict=True):
        assert torch.equal(la, lb) and torch.equal(xa, xb)


@pytest.mark.parametrize("use_dali", BACKENDS)
def test_bad_images_are_skipped_and_counted(tmp_path, use_dali, caplog):
    paths = write_images(tmp_path, per_class=6)
    data = paths[4].read_bytes()
    paths[4].write_bytes(data[: len(data) // 3])  # truncated: header fine, body broken
    paths[7].write_bytes(b"")  # empty
    (tmp_path / "class1" / "notes.jpg").write_text("not an image")
    spec = make_spec(tmp_path, ranks=1, use_dali=use_dali, augment=False)  # one rank sees every image
    with caplog.at_level(logging.WARNING, logger="meshrun.data"):
        it = loader(spec)
        batches = take(it, it.order.batches_per_epoch)
    assert it.bad_samples.count == 3  # two at the scan, the truncated one at decode
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert all(name in warned for name in (paths[4].name, "class1/img001.jpg (empty file)", "notes.jpg"))
    assert len(batches) == 2  # 16 usable images; the truncated one's slot repeats a neighbour
    assert all(x.shape == (8, 3, SIZE, SIZE) and torch.isfinite(x).all() for x, _ in batches)


def test_bad_image_fails_when_configured(tmp_path):
    paths = write_images(tmp_path, per_class=6)
    paths[3].write_bytes(b"\xff\xd8\xff\xe0" + b"junk" * 50)
    with pytest.raises(ConfigError, match="on_bad_sample='fail'"):
        take(loader(make_spec(tmp_path, use_dali=HAVE_DALI, policy="fail")), 4)
    with pytest.raises(ConfigError, match="bad_sample_limit=0"):
        take(loader(make_spec(tmp_path, use_dali=HAVE_DALI, limit=0)), 4)


def test_folder_errors(tmp_path):
    with pytest.raises(ConfigError, match="not a directory"):
        loader(make_spec(tmp_path / "nope"))
    (tmp_path / "flat").mkdir()
    with pytest.raises(ConfigError, match="no class sub-folders"):
        loader(make_spec(tmp_path / "flat"))
    (tmp_path / "flat" / "a").mkdir()
    with pytest.raises(ConfigError, match="no readable images"):
        loader(make_spec(tmp_path / "flat"))
    write_images(tmp_path / "small", classes=1, per_class=3)
    with pytest.raises(ConfigError, match="cannot fill one global batch"):
        loader(make_spec(tmp_path / "small"))
