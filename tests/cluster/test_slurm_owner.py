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

ROOT = Path(__file__).resolve().parents[2]
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


# --- one owner across local runs, Slurm jobs and sweep points ----------------------------------


def launcher_cmd(
    *args: str, env: dict[str, str], cwd: Path, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "launcher", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def submitted_job(out: str) -> str:
    return out.split("submitted job ")[1].split(":")[0]


def test_local_run_and_slurm_job_never_share_a_run_dir(tmp_path: Path, slurm_env: dict[str, str]) -> None:
    """A local run holds the run dir: a submission of it is refused before
    anything is written or submitted. A submitted job holds it: a local start
    of it is refused naming the job."""
    local_dir = tmp_path / "local"
    local = subprocess.Popen(
        [sys.executable, "-m", "launcher", "model=tiny", "cluster.local_processes=1", "train.steps=100000",
         f"launcher.run_dir={local_dir}"],
        cwd=tmp_path, env=slurm_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert local.stdout is not None
        line = local.stdout.readline()  # "meshrun: <layout>; run <id> in <dir>": the lock is held
        assert f"in {local_dir}" in line, line
        sub = launcher_cmd(*SMALL, f"launcher.run_dir={local_dir}", env=slurm_env, cwd=tmp_path)
        assert sub.returncode == 2, sub.stdout + sub.stderr
        assert f"launcher.run_dir='{local_dir}' is in use: launcher pid {local.pid}" in sub.stderr, sub.stderr
        assert "submitted job" not in sub.stdout and not (local_dir / "slurm").exists()
    finally:
        local.terminate()
        local.communicate(timeout=120)

    job_dir = tmp_path / "job"
    first = launcher_cmd(*SMALL, f"launcher.run_dir={job_dir}", env=slurm_env, cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    job_id = submitted_job(first.stdout)
    try:
        here = launcher_cmd("model=tiny", f"launcher.run_dir={job_dir}", env=slurm_env, cwd=tmp_path)
        assert here.returncode == 2, here.stdout + here.stderr
        assert f"is in use: Slurm job {job_id} (" in here.stderr, here.stderr
        assert not (job_dir / "result.json").exists()
    finally:
        subprocess.run(["scancel", job_id], env=slurm_env, capture_output=True)


def test_two_submissions_at_once_make_one_job(tmp_path: Path, slurm_env: dict[str, str]) -> None:
    """The owner check and sbatch run under the run dir's lock: two
    submissions of one new run dir started together give one job."""
    run_dir = tmp_path / "race"
    cmd = [sys.executable, "-m", "launcher", *SMALL, f"launcher.run_dir={run_dir}"]
    procs = [
        subprocess.Popen(
            cmd, cwd=tmp_path, env=slurm_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=180) for p in procs]
    jobs = [submitted_job(out) for out, _ in outs if "submitted job " in out]
    try:
        assert sorted(p.returncode for p in procs) == [0, 2], outs
        assert len(jobs) == 1, outs
        (err,) = [e for p, (_, e) in zip(procs, outs, strict=True) if p.returncode == 2]
        assert f"launcher.run_dir='{run_dir}' is in use: " in err, err
    finally:
        for job in jobs:
            subprocess.run(["scancel", job], env=slurm_env, capture_output=True)


def test_sweep_points_sharing_a_run_dir_are_refused_before_anything(
    tmp_path: Path, slurm_env: dict[str, str]
) -> None:
    run_dir, sweep = tmp_path / "shared", tmp_path / "sweep"
    p = launcher_cmd(
        "-m", *SMALL, "train.seed=1,2,3", f"launcher.run_dir={run_dir}", f"hydra.sweep.dir={sweep}",
        env=slurm_env, cwd=tmp_path,
    )  # fmt: skip
    assert p.returncode == 2, p.stdout + p.stderr
    assert f"points #0, #1, #2 share launcher.run_dir='{run_dir}'" in p.stdout, p.stdout
    assert "0 submitted in 0 job array(s)" in p.stdout and "nothing was written or submitted" in p.stdout
    assert not run_dir.exists() and not sweep.exists()
    assert list(tmp_path.iterdir()) == []
