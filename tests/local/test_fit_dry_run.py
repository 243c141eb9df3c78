"""README's first Slurm command as a dry run without a reachable Slurm
(launcher/plan/qosshare.py): rendered as typed, with a line that says what
the preset's share would be."""

from __future__ import annotations

from pathlib import Path

from harness import cli

NO_SLURM = {"SLURM_CONF": "/nonexistent/slurm.conf"}  # Slurm's commands cannot be asked


def test_headline_dry_run_renders_the_request_as_typed(tmp_path: Path) -> None:
    """README's first Slurm command, without a reachable Slurm: 4 nodes, and a
    line that says what the preset's share would be."""
    p = cli(
        "model=13b",
        "cluster=4node",
        "launcher.dry_run=true",
        f"launcher.run_dir={tmp_path / 'r'}",
        env=NO_SLURM,
    )
    assert p.returncode == 0, p.stderr
    assert "#SBATCH --nodes=4\n" in p.stdout and "#SBATCH --gpus-per-node=8\n" in p.stdout
    assert "Slurm could not be asked about this request" in p.stdout
    assert "(4 nodes x 8 GPUs = 32 GPUs) is over qos=research's share of cluster=4node's 32 GPUs" in p.stdout
    assert "cluster.nodes=1 (8 GPUs)" in p.stdout
    assert not (tmp_path / "r").exists()
    # A size that fits says nothing about shares, and is rendered as typed too.
    p = cli(
        "cluster=4node",
        "cluster.nodes=1",
        "launcher.dry_run=true",
        f"launcher.run_dir={tmp_path / 'r'}",
        env=NO_SLURM,
    )
    assert p.returncode == 0 and "#SBATCH --nodes=1\n" in p.stdout and "share" not in p.stdout, p.stdout
