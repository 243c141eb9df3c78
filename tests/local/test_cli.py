"""The CLI as a user meets it: help, Hydra's flags, the dry run, no Slurm."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def launcher(
    *args: str, env: dict[str, str] | None = None, timeout: int = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "launcher", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=env,
    )


def test_help_lists_groups_and_examples() -> None:
    p = launcher("--help")
    assert p.returncode == 0, p.stderr
    assert "launcher.dry_run=true" in p.stdout
    assert "cluster: " in p.stdout and "4node" in p.stdout
    assert "parallelism: auto, fsdp, fsdp_tp, fsdp_tp_pp, hsdp" in p.stdout


@pytest.mark.parametrize("flag", [["--cfg", "job"], ["--info"]])
def test_hydra_flags_work(flag: list[str]) -> None:
    p = launcher("model=13b", *flag)
    assert p.returncode == 0, p.stderr
    if flag[0] == "--cfg":
        assert "dim: 5120" in p.stdout and "n_layers: 40" in p.stdout


def test_dry_run_prints_plan_and_sbatch_without_submitting(tmp_path: Path) -> None:
    run_dir = tmp_path / "dry"
    p = launcher(
        "model=13b",
        "cluster=4node",
        "cluster.nodes=4",
        "launcher.dry_run=true",
        f"launcher.run_dir={run_dir}",
    )
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "fsdp_tp" in out and "tp=8" in out
    assert "memory per GPU" in out and "of 80" in out
    assert "on-demand" in out and "reserved" in out
    assert "#SBATCH --nodes=4" in out
    assert "#SBATCH --ntasks-per-node=8" in out
    assert "nothing was started or submitted" in out
    assert not (run_dir / "spec.json").exists()


def test_slurm_cluster_without_slurm_suggests_local(tmp_path: Path) -> None:
    # A PATH with python but no sbatch/squeue: what a laptop looks like.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python").symlink_to(sys.executable)
    env = dict(os.environ, PATH=str(bindir))
    p = launcher("model=7b", "cluster=1node", f"launcher.run_dir={tmp_path / 'r'}", env=env)
    assert p.returncode != 0
    assert "no Slurm is reachable" in p.stderr
    assert "cluster=local" in p.stderr and "launcher.dry_run=true" in p.stderr
