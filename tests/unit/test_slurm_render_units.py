"""Rendering the sbatch script: golden files, flags, errors. No Slurm needed.

Here: its tests that start no process, no process group and no server
(tier unit); the rest: tests/local/test_slurm_render.py."""

from __future__ import annotations

import sys
from pathlib import Path

from launcher.config.runfiles import REQUEUE_EXIT_CODE

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import regen_golden  # noqa: E402


def test_golden_presets_cover_pyxis_and_testcluster() -> None:
    presets = regen_golden.slurm_presets()
    assert "testcluster" in presets and "4node" in presets
    text = (ROOT / "tests" / "golden" / "sbatch_4node.sh").read_text()
    for flag in (
        "--container-image=",
        "--container-mounts=",
        "--container-workdir=",
        "--no-container-mount-home",
    ):
        assert flag in text
    # The job folder and the code are mounted into the container.
    mounts = next(w for w in text.split() if w.startswith("--container-mounts="))
    assert "/opt/meshrun:/workspace/meshrun" in mounts
    assert "/shared/runs/golden/4node:/shared/runs/golden/4node" in mounts
    assert "--container-image" not in (ROOT / "tests" / "golden" / "sbatch_testcluster.sh").read_text()


def test_requeue_exit_code_matches_train() -> None:
    from launcher.config.runfiles import REQUEUE_EXIT_CODE as TRAIN_CODE
    from launcher.config.runfiles import UNCOMMITTED_EXIT_CODE
    from launcher.config.runfiles import UNCOMMITTED_EXIT_CODE as TRAIN_UNCOMMITTED

    assert TRAIN_CODE == REQUEUE_EXIT_CODE
    assert TRAIN_UNCOMMITTED == UNCOMMITTED_EXIT_CODE != REQUEUE_EXIT_CODE
