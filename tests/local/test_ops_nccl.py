"""NCCL presets: per-fabric settings with reasons, merge order with the
cluster preset's env and command-line overrides, the exported task env.
Tests that start no process: tests/unit/test_ops_nccl_units.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_dry_run_exports_the_merged_env() -> None:
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "launcher",
            "cluster=4node",
            "launcher.dry_run=true",
            "cluster.env.NCCL_DEBUG=INFO",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert "export NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7" in p.stdout
    assert "export NCCL_DEBUG=INFO" in p.stdout
    assert "export NCCL_NET_GDR_LEVEL=PXB" in p.stdout
