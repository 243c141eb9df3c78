"""launcher.image without Enroot: what it pins, and what it refuses."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest

from launcher.commands import image as image_cli
from launcher.slurm import imagebuild as image


def test_requirements_pinned_to_this_environment() -> None:
    dists = image.dependency_closure(image.runtime_requirements())
    pins = image.pinned(dists)
    for name in ("hydra-core", "omegaconf", "submitit", "torch", "numpy", "boto3"):
        assert f"{name}=={metadata.version(name)}" in {p.lower() for p in pins} | set(pins), (name, pins)
    # Transitive dependencies come along (hydra-core needs antlr4).
    assert any(p.lower().startswith("antlr4-python3-runtime==") for p in pins)
    # pip mode keeps the base's torch (e.g. NGC's CUDA build).
    assert not any(p.lower().startswith("torch==") for p in image.pinned(dists, keep=["torch"]))


def test_missing_base_is_refused_and_writes_nothing(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(image.shutil, "which", lambda name: "/usr/bin/" + name)
    rc = image_cli.main(["build", "--base", "nope.sqsh", "--out", "out/x.sqsh", "--deps", "copy"])
    err = capsys.readouterr().err
    assert rc == 2 and f"--base '{tmp_path}/nope.sqsh': no such file" in err, err
    assert not (tmp_path / "out").exists()


def test_without_enroot_says_so(monkeypatch, capsys) -> None:
    monkeypatch.setattr(image.shutil, "which", lambda name: None)
    with pytest.raises(image.ImageError, match="enroot not found"):
        image.build("/x.sqsh", "/tmp/never.sqsh")
