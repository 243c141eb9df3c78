"""Refusals and failed submissions against the shared local Slurm test cluster
(its partitions, QOS and accounts; sbatch itself stays fake): nothing is
written, or what was written is removed or restored, and no credential is
written. The refusals that need no cluster: tests/local/test_cli_refusals.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from harness import SECRET, assert_refused, fake_sbatch_cli
from testcluster_util import require_test_cluster

SLURM = ["cluster=testcluster", "model=tiny"]


@pytest.fixture
def test_cluster() -> dict[str, str]:
    """The shared local Slurm test cluster (scripts/testcluster.sh), for the
    partition/qos/account checks; sbatch itself stays fake."""
    return {"SLURM_CONF": require_test_cluster()}


SMALL = [
    *SLURM,
    "cluster.nodes=1",
    "cluster.gpus_per_node=2",
    "launcher.exclusive=false",
    "qos.time_limit_min=3",
]


def test_request_the_cluster_refuses_writes_nothing(tmp_path: Path, test_cluster: dict[str, str]) -> None:
    proc, cwd, calls = fake_sbatch_cli(tmp_path, *SMALL, "qos.partition=nosuch", env=test_cluster)
    assert_refused(proc, cwd, calls, 2, ["qos.partition='nosuch'", "no such partition", "research"])


def test_failed_submission_removes_the_run_dir(tmp_path: Path, test_cluster: dict[str, str]) -> None:
    body = (
        'echo "sbatch: error: Batch job submission failed: Invalid account or account/partition '
        'combination specified" >&2; exit 1'
    )
    proc, cwd, calls = fake_sbatch_cli(tmp_path, *SMALL, sbatch=body, env=test_cluster)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 3, out
    assert "submission failed" in out and "Invalid account" in out and "nothing was submitted" in out
    assert "removed" in out and "Traceback" not in out
    assert len([ln for ln in proc.stderr.splitlines() if ln.strip()]) == 1, proc.stderr  # one line
    assert list(cwd.iterdir()) == []
    assert len(calls.read_text().splitlines()) == 1  # sbatch was asked once, and refused


def test_failed_submission_restores_a_resumed_run_dir(tmp_path: Path, test_cluster: dict[str, str]) -> None:
    run_dir = tmp_path / "cwd" / "run"
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text("old: config\n")
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')
    (run_dir / "run_id").write_text("old-run-20261201T000000Z-abcd\n")
    proc, cwd, calls = fake_sbatch_cli(
        tmp_path,
        *SMALL,
        f"launcher.run_dir={run_dir}",
        "launcher.resume=force",  # its config.yaml differs: resume it anyway
        sbatch='echo "sbatch: error: down" >&2; exit 1',
        env=test_cluster,
    )
    assert proc.returncode == 3, proc.stderr
    assert "restored" in proc.stderr
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.yaml", "metrics.jsonl", "run_id"]
    assert (run_dir / "config.yaml").read_text() == "old: config\n"


def test_accepted_submission_writes_no_credential(tmp_path: Path, test_cluster: dict[str, str]) -> None:
    """Credentials never go into what the run writes nor reach sbatch: with
    keys exported, an accepted submission's files do not contain them, and
    sbatch runs without them (it would store them in Slurm); the job names
    the credentials file instead."""
    creds = tmp_path / "aws-credentials"
    creds.write_text("[default]\n")
    creds.chmod(0o600)
    env = {**test_cluster, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE"}
    proc, cwd, calls = fake_sbatch_cli(
        tmp_path,
        *SMALL,
        "storage=nvme_s3",
        "storage.s3_bucket=ckpt-bucket",
        f"storage.s3_credentials_file={creds}",
        sbatch=f'env > "{tmp_path}/sbatch_env"; echo "Submitted batch job 4242"',
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "submitted job 4242" in proc.stdout
    assert "not passed to Slurm (credentials): AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY" in proc.stdout
    sbatch_env = (tmp_path / "sbatch_env").read_text()
    assert not [ln for ln in sbatch_env.splitlines() if ln.startswith(("AWS_ACCESS_KEY_ID=", "AWS_SECRET"))]
    assert SECRET not in sbatch_env and "AKIAIOSFODNN7EXAMPLE" not in sbatch_env
    assert "SLURM_CONF=" in sbatch_env  # the rest of the environment is passed on
    script = next(cwd.rglob("*_submission.sh")).read_text()
    assert f"export AWS_SHARED_CREDENTIALS_FILE={creds}" in script
    written = [p for p in cwd.rglob("*") if p.is_file()]
    names = {p.name for p in written}
    assert {"spec.json", "config.yaml", "plan.json", "job.json"} <= names, names
    assert not any(p.name == ".hydra" for p in cwd.rglob("*"))
    for p in written:
        text = p.read_text(errors="replace")
        assert SECRET not in text and "AKIAIOSFODNN7EXAMPLE" not in text, p
    spec = json.loads(next(p for p in written if p.name == "spec.json").read_text())
    assert spec["version"] == 1


def test_sweep_whose_submission_fails_leaves_nothing(tmp_path: Path, test_cluster: dict[str, str]) -> None:
    """sbatch refuses the job array: every point is counted failed (one line
    each), the run dirs and the sweep dir written for it are removed, exit 3."""
    proc, cwd, calls = fake_sbatch_cli(
        tmp_path,
        "-m",
        *SMALL,
        "train.lr=0.001,0.002",
        "parallelism.tp=1,3",
        sbatch='echo "sbatch: error: Batch job submission failed: Job violates accounting/QOS policy" >&2; exit 1',
        env=test_cluster,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 3, out
    assert "0 submitted" in out and "2 invalid; 2 failed" in out, out
    # One refusal of one array: its reason said once, the other point pointed to it.
    assert out.count("accounting/QOS policy") == 1 and "failed: the same reason as #0" in out
    assert "run dir removed" in out
    assert "Traceback" not in out and "nothing was written or submitted" in out
    assert list(cwd.iterdir()) == [], sorted(str(p) for p in cwd.rglob("*"))
    assert len(calls.read_text().splitlines()) == 1  # one job array, refused


@pytest.mark.parametrize(
    "args, expected",
    [
        (
            [],
            [
                "storage.s3_credentials='auto'",
                "storage.s3_credentials_file=<path",
                "storage.s3_credentials=role",
            ],
        ),
        (["storage.s3_credentials_file=@OPEN@"], ["every user can read it: chmod 600"]),
    ],
)
def test_s3_on_slurm_needs_a_credentials_source(
    tmp_path: Path, test_cluster: dict[str, str], args: list[str], expected: list[str]
) -> None:
    """An S3 run on Slurm without a file or a role, or with a file every user
    can read, is refused before anything is written or submitted (the other
    refusals: tests/local/test_validation.py)."""
    open_file = tmp_path / "open-credentials"
    open_file.write_text("[default]\n")
    open_file.chmod(0o644)
    env = {**test_cluster, "AWS_SECRET_ACCESS_KEY": SECRET}
    args = [a.replace("@OPEN@", str(open_file)) for a in args]
    proc, cwd, calls = fake_sbatch_cli(
        tmp_path, *SMALL, "storage=nvme_s3", "storage.s3_bucket=ckpt-bucket", *args, env=env
    )
    assert_refused(proc, cwd, calls, 2, expected)
