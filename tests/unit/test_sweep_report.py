"""A sweep's report says a reason shared by many points once (a Slurm refusal
of one request is the same for every point of it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hydra_plugins.meshrun_launcher.meshrun_launcher import MeshrunLauncher


def test_a_shared_reason_is_said_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    why = "qos=research allows 12 GPUs; this request holds 32 (sbatch: error: QOSMaxGRESPerJob) " * 3
    points = {
        n: {"point": n, "overrides": [f"train.lr={lr}"], "status": "failed", "reason": why}
        for n, lr in enumerate(("1e-3", "3e-3", "1e-2"))
    }
    points[3] = {"point": 3, "overrides": ["train.lr=1"], "status": "invalid", "reason": "other"}
    MeshrunLauncher._report(points, tmp_path, 0.1)
    out = capsys.readouterr().out
    assert out.count(why) == 1
    assert out.count("failed: the same reason as #0") == 2
    assert "invalid: other" in out
