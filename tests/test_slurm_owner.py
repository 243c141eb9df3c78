"""On the real test cluster (scripts/testcluster.sh): a submitted run's Slurm
job is named by its run id, or by launcher.job_name exactly as typed (spaces,
non-Latin letters), and a run dir whose job is still queued or running is not
submitted again (one owner at a time)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from testcluster_util import require_test_cluster

from launcher.config.runid import read_run_id

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slurm
SMALL = [
    "cluster=testcluster",
    "model=tiny",
    "launcher.exclusive=false",
    "qos.time_limit_min=3",
    "launcher.signal_lead_s=30",
    "cluster.nodes=1",
    "cluster.gpus_per_node=2",
    "train.steps=100000",
]


@pytest.fixture()
def slurm_env() -> dict[str, str]:
    return dict(os.environ, SLURM_CONF=require_test_cluster(), PYTHONPATH=str(ROOT))


def test_job_is_named_by_run_id_and_owns_its_run_dir(tmp_path: Path, slurm_env: dict[str, str]) -> None:
    run_dir = tmp_path / "run"

    def submit() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "launcher", *SMALL, f"launcher.run_dir={run_dir}"],
            cwd=ROOT,
            env=slurm_env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    first = submit()
    assert first.returncode == 0, first.stdout + first.stderr
    job_id = first.stdout.split("submitted job ")[1].split(":")[0]
    try:
        name = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", "%j"], env=slurm_env, capture_output=True, text=True
        ).stdout.strip()
        assert name == read_run_id(run_dir) != "", (name, read_run_id(run_dir))
        second = submit()
        assert second.returncode == 2, second.stdout + second.stderr
        assert f"is in use: Slurm job {job_id} (" in second.stderr, second.stderr
        assert "Traceback" not in second.stderr
    finally:
        subprocess.run(["scancel", job_id], env=slurm_env, capture_output=True)


def test_sweep_points_get_their_own_ids_and_the_array_the_sweeps(
    tmp_path: Path, slurm_env: dict[str, str]
) -> None:
    """Two Slurm sweeps of the same shape: every point has its own run id;
    each job array is named by its sweep's id."""
    import json

    sweeps = [tmp_path / "a", tmp_path / "b"]
    jobs: list[str] = []
    try:
        for sweep in sweeps:
            p = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "launcher",
                    "-m",
                    *SMALL,
                    "train.seed=1,2",
                    f"hydra.sweep.dir={sweep}",
                ],
                cwd=ROOT,
                env=slurm_env,
                capture_output=True,
                text=True,
                timeout=180,
            )
            assert p.returncode == 0, p.stdout + p.stderr
            manifest = json.loads((sweep / "manifest.json").read_text())
            arrays = {pt["array"] for pt in manifest["points"]}
            assert len(arrays) == 1 and all(pt["status"] == "submitted" for pt in manifest["points"])
            jobs += arrays
            name = subprocess.run(
                ["squeue", "-h", "-j", next(iter(arrays)), "-o", "%j"],
                env=slurm_env,
                capture_output=True,
                text=True,
            ).stdout.split()
            assert set(name) == {manifest["sweep_id"]}, (name, manifest["sweep_id"])
        points = [pt for s in sweeps for pt in json.loads((s / "manifest.json").read_text())["points"]]
        ids = [pt["run_id"] for pt in points]
        assert len(set(ids)) == 4 and all(read_run_id(pt["run_dir"]) == pt["run_id"] for pt in points)
    finally:
        for job in jobs:
            subprocess.run(["scancel", job], env=slurm_env, capture_output=True)


def test_typed_job_name_reaches_squeue_exactly(tmp_path: Path, slurm_env: dict[str, str]) -> None:
    """A job name with spaces and non-Latin letters is accepted, quoted in the
    sbatch script, and Slurm shows it as typed; the run id keeps its safe form."""
    name = "my llama run обучение-λ"
    run_dir = tmp_path / "named"
    p = subprocess.run(
        [sys.executable, "-m", "launcher", *SMALL, f'launcher.job_name="{name}"', f"launcher.run_dir={run_dir}"],
        cwd=ROOT, env=slurm_env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    job_id = p.stdout.split("submitted job ")[1].split(":")[0]
    try:
        shown = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", "%j"],
            env=slurm_env,
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.rstrip("\n")
        assert shown == name, (shown, name)
        assert read_run_id(run_dir).startswith("my-llama-run-")
    finally:
        subprocess.run(["scancel", job_id], env=slurm_env, capture_output=True)
