"""A sweep's dry run (``python -m launcher -m ... launcher.dry_run=true``):
one table with a row per point (swept values, layout, memory, speed, cost,
valid or why not), each distinct warning and refusal once, nothing written;
``-v`` prints every point's full plan and sbatch script as before.
Tests that start no process: tests/unit/test_sweep_dry_run_units.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

from harness import fake_sbatch_cli

from launcher.views.sweepdry import DryPoint, dry_run_table, gather

# 4 points on a Slurm preset: tiny fits, 405b does not fit on 8 GPUs.
SWEEP = ["-m", "model=tiny,405b", "train.lr=1e-3,3e-4", "cluster=1node", "launcher.dry_run=true"]
SHARE = "is over qos=research's share"  # the QOS share note, said by each point's single dry run


def run_cli(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The CLI in an empty dir, a fake sbatch recording calls (none may come), no SLURM_CONF:
    the same notes on every host."""
    proc, cwd, calls = fake_sbatch_cli(tmp_path, *args, unset=["SLURM_CONF"])
    assert not calls.exists(), "a dry run calls no sbatch"
    return proc, cwd


def test_sweep_dry_run_is_one_table(tmp_path: Path) -> None:
    proc, cwd = run_cli(tmp_path, *SWEEP)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    lines = out.splitlines()
    head = lines[0].split()
    assert head[:3] == ["#", "model", "train.lr"], lines[0]
    for col in ("GPUs", "layout", "mem", "step", "tok/s", "cost", "valid"):
        assert col in head, lines[0]
    rows = {line.split()[0]: line.split() for line in lines[2:6]}
    assert sorted(rows) == ["0", "1", "2", "3"], out
    assert rows["0"][1:3] == ["tiny", "0.001"] and rows["1"][1:3] == ["tiny", "0.0003"], out
    assert rows["2"][1:3] == ["405b", "0.001"] and rows["3"][1:3] == ["405b", "0.0003"], out
    assert rows["0"][-1] == "yes" and "fsdp:" in lines[2] and "$" in lines[2], out
    # The refused points say why in the row, the whole reason once below.
    assert "no: model=405b does not fit" in lines[4] and "no: model=405b does not fit" in lines[5], out
    assert out.count("refused (points #2, #3): model=405b does not fit: ") == 1, out
    assert out.count(SHARE) == 1 and "warning (points #0, #1): " in out, out
    assert "sweep of 4:" in out and "2 dry run; 2 invalid" in out, out
    assert "# sbatch script submitit would submit" not in out and "meshrun plan:" not in out, out
    assert len(lines) <= 20, out  # each point's plan and script: 150+ lines a point before
    assert list(cwd.iterdir()) == [], "a dry run writes nothing"


def test_a_warning_on_some_points_says_which(tmp_path: Path) -> None:
    """A plan warning (tiny on 2 GPUs) once, naming the points it applies to."""
    proc, _ = run_cli(
        tmp_path,
        "-m",
        "cluster=1node",
        "cluster.gpus_per_node=2,8",
        "train.lr=1e-3,3e-4",
        "launcher.dry_run=true",
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.splitlines()[0].split()[:3] == ["#", "cluster.gpus_per_node", "train.lr"], out
    assert out.count("FSDP for models under 7B wants at least 4 GPUs") == 1, out
    assert "warning (points #0, #1): FSDP for models under 7B" in out, out
    # The share note names each point's own numbers: one line per distinct text.
    assert out.count(SHARE) == 2 and "(points #2, #3): this request (1 node x 8 GPUs" in out, out


def test_verbose_prints_every_point_in_full(tmp_path: Path) -> None:
    proc, cwd = run_cli(tmp_path, *SWEEP, "-v")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.count("meshrun plan: model=tiny cluster=1node") == 2, out
    assert out.count("# sbatch script submitit would submit:") == 2, out
    assert out.count(SHARE) == 2 and "mem GB/usable" not in out, out
    # Points #2 and #3 are refused for one reason: said once, then pointed to.
    assert "meshrun: #2 model=405b" in out and out.count("invalid: model=405b does not fit") == 1, out
    assert "meshrun:     invalid: the same reason as #2" in out, out
    assert list(cwd.iterdir()) == []


def _raise(e: Exception):
    def f(*_: object) -> None:
        raise e

    return f


def test_slurm_is_asked_once_a_request_and_a_refusal_is_said(tmp_path: Path, monkeypatch) -> None:
    """Reachable Slurm: sbatch --test-only once for points whose scripts differ
    only in the run dir; a request it would refuse is said in the row, not enforced."""
    from launcher.config.compose import compose
    from launcher.config.validate import ConfigError
    from launcher.run.prepare import prepare
    from launcher.slurm import cluster as slurm

    def points() -> list[DryPoint]:
        specs = [
            prepare(
                compose(["cluster=1node", f"train.lr={lr}", "launcher.dry_run=true"]), str(tmp_path / str(i))
            )
            for i, lr in enumerate((0.1, 0.2))
        ]
        return [
            DryPoint(i, [f"train.lr={lr}"], s)
            for i, (lr, s) in enumerate(zip((0.1, 0.2), specs, strict=True))
        ]

    asked: list[str] = []
    monkeypatch.setattr(slurm, "check_request", lambda spec: asked.append(spec.run_dir))
    monkeypatch.setattr(slurm, "test_only", lambda spec: "Job 7 to start at 2026-01-01T00:00:00")
    ok = points()
    gather(ok, slurm_reachable=True)
    lines = dry_run_table(ok)
    assert len(asked) == 1 and lines[2].endswith("yes") and lines[3].endswith("yes"), lines
    assert sum("sbatch --test-only: Job 7 to start" in line for line in lines) == 1, lines

    monkeypatch.setattr(
        slurm, "check_request", _raise(ConfigError("qos.partition='nosuch': no such partition"))
    )
    refused = points()
    gather(refused, slurm_reachable=True)
    lines = dry_run_table(refused)
    assert lines[2].endswith("no: Slurm would refuse this request") and "$" in lines[2], lines
    assert (
        "meshrun: refused (all 2 points): Slurm would refuse this request: qos.partition='nosuch'"
        in "\n".join(lines)
    )
