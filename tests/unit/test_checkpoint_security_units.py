"""No pickle from checkpoint storage runs code: a crafted ``extra_rank0.pt``
(a pickle whose ``__reduce__`` would run a command), with its manifest entry
rewritten to match, as whoever can write the bucket prefix could, is refused
at resume and runs nothing.

Here: its tests that start no process, no process group and no server
(tier unit); the rest: tests/local/test_checkpoint_security.py."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))


def test_save_refuses_extra_state_that_resume_could_not_read(tmp_path: Path) -> None:
    """Per-rank state holding an arbitrary object fails its save (said and
    counted), instead of a checkpoint that resume would have to refuse."""
    import torch
    from ckpt_drill import build_model

    from launcher.config.schema import ClusterConfig, RunConfig
    from launcher.config.spec import RunSpec
    from launcher.plan.make import make_plan
    from train.checkpoint import CheckpointManager
    from train.loop.state import ModelState, OptimState
    from train.parallel.dist import DistInfo

    class Odd:
        def state_dict(self) -> dict:
            return {"when": textwrap.TextWrapper()}  # not a tensor, number or container

    cfg = RunConfig(cluster=ClusterConfig(local_processes=1))
    spec = RunSpec(cfg=cfg, plan=make_plan(cfg), run_dir=str(tmp_path / "run"), run_id="security-test-0002")
    model = build_model(16, 1, 1)
    opt = torch.optim.AdamW(model.parameters())
    ckpt = CheckpointManager(spec, DistInfo(0, 1, 0, 1, 0, "cpu", "gloo", "127.0.0.1", 0))
    ckpt.save(1, {"model": ModelState([model]), "optim": OptimState([model], [opt]), "odd": Odd()})
    report = ckpt.finalize(timeout_s=120)
    assert report["committed_steps"] == [] and not report["commit_done"], report
    assert "preparing the save failed" in report["last_save_error"], report
    assert "weights_only" in report["last_save_error"] or "Unsupported" in report["last_save_error"], report
