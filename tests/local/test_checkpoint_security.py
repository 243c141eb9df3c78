"""No pickle from checkpoint storage runs code: a crafted ``extra_rank0.pt``
(a pickle whose ``__reduce__`` would run a command), with its manifest entry
rewritten to match, as whoever can write the bucket prefix could, is refused
at resume and runs nothing.
Tests that start no process: tests/unit/test_checkpoint_security_units.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))


class _Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.marker}",))


def test_crafted_extra_file_runs_no_code_at_resume(tmp_path: Path) -> None:
    import torch
    from ckpt_drill import build_model

    from launcher.config.schema import ClusterConfig, RunConfig
    from launcher.config.spec import RunSpec
    from launcher.plan.make import make_plan
    from train.checkpoint import CheckpointManager
    from train.checkpoint.manifest import FileEntry, bytes_digest, read_manifest, write_manifest
    from train.loop.state import ModelState, OptimState, Progress
    from train.parallel.dist import DistInfo

    cfg = RunConfig(cluster=ClusterConfig(local_processes=1))
    spec = RunSpec(cfg=cfg, plan=make_plan(cfg), run_dir=str(tmp_path / "run"), run_id="security-test-0001")
    info = DistInfo(0, 1, 0, 1, 0, "cpu", "gloo", "127.0.0.1", 0)
    model = build_model(16, 1, 1)
    opt = torch.optim.AdamW(model.parameters())
    state = {"model": ModelState([model]), "optim": OptimState([model], [opt]), "progress": Progress(step=1)}
    ckpt = CheckpointManager(spec, info)
    ckpt.save(1, state)
    assert ckpt.finalize(timeout_s=120)["committed_steps"] == [1]

    step_dir = Path(ckpt.root) / "step_1"
    marker = tmp_path / "pwned"
    crafted = step_dir / "extra_rank0.pt"
    torch.save({"progress": _Evil(str(marker))}, crafted)
    data = crafted.read_bytes()
    manifest = read_manifest(step_dir)
    assert manifest is not None
    old = manifest.files["extra_rank0.pt"]
    manifest.files["extra_rank0.pt"] = FileEntry(len(data), bytes_digest(data, old.algo), old.rank, old.algo)
    write_manifest(step_dir, manifest)
    # The file is a real exploit: an unrestricted load runs its command.
    probe = tmp_path / "probe.pt"
    torch.save({"progress": _Evil(str(tmp_path / "probe-ran"))}, probe)
    code = f"import torch, sys; sys.path.insert(0, {str(Path(__file__).parent.parent)!r}); torch.load({str(probe)!r}, weights_only=False)"
    subprocess.run([sys.executable, "-c", code], check=False, timeout=120, capture_output=True)
    assert (tmp_path / "probe-ran").exists()

    fresh = build_model(16, 1, 1)
    fresh_opt = torch.optim.AdamW(fresh.parameters())
    reader = CheckpointManager(spec, info)
    with pytest.raises(
        RuntimeError, match=r"extra_rank0.pt: refused: it is not plain tensors and containers"
    ):
        reader.resume(
            {"model": ModelState([fresh]), "optim": OptimState([fresh], [fresh_opt]), "progress": Progress()}
        )
    reader.worker.close()
    assert not marker.exists(), "the crafted pickle ran code at resume"
