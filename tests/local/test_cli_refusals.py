"""Every bad input is refused before anything is written or submitted.

``python -m launcher`` runs as a subprocess in an empty working directory
with a fake ``sbatch`` (and ``squeue``) first on PATH that records its calls.
Each refusal must: exit with the documented code (2: refused input, 3: Slurm
failed), name the field and the value (and the choices for an enumeration),
print no traceback, leave the working directory empty (no Hydra ``.hydra/``,
no log, no run dir), call no ``sbatch``, and print no credential.

One case per class of issue 12: hostile strings, credentials, impossible
plans, errors naming the field set, Hydra grammar and composition errors,
run dir paths, an unconfigured Slurm; sweeps below. What the test cluster
refuses and failed submissions: tests/cluster/test_cli_refusals_cluster.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from harness import SECRET, assert_refused, fake_sbatch_cli

MARK = "/tmp/meshrun-test-pwned"
SLURM = ["cluster=testcluster", "model=tiny"]
# (class, arguments, exit code, what the message must contain)
CASES = [
    # Strings that would reach the batch shell: refused as names, never run
    # (a job name is free text, quoted: only what Slurm cannot keep is refused).
    (
        "hostile",
        [*SLURM, "launcher.job_name='a\nsrun evil'"],
        2,
        ["launcher.job_name=", "control characters"],
    ),
    ("hostile", [*SLURM, f"launcher.job_name={'a' * 256}"], 2, ["launcher.job_name=", "keeps 255 bytes"]),
    ("hostile", [*SLURM, "qos.account='acct `id`'"], 2, ["qos.account=", "plain name"]),
    ("hostile", [*SLURM, "+cluster.env.'A;B'=1"], 2, ["cluster.env"]),
    ("hostile", [*SLURM, "launcher.dry_run=true", "qos.partition='p\\nq'"], 2, ["qos.partition"]),
    # Credentials: refused before any file, the value masked.
    (
        "secret",
        ["storage.s3_endpoint_url=https://user:pass@s3.example.com"],
        2,
        ["storage.s3_endpoint_url", "***"],
    ),
    ("secret", [f"+cluster.env.AWS_SECRET_ACCESS_KEY={SECRET}"], 2, ["AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"]),
    (
        "secret",
        [f"cluster.env.AWS_SECRET_ACCESS_KEY={SECRET}"],  # no '+': refused before Hydra's own error
        2,
        ["cluster.env.AWS_SECRET_ACCESS_KEY='***'"],
    ),
    ("secret", [*SLURM, f"+cluster.env.MY_TOKEN={SECRET}"], 2, ["cluster.env.MY_TOKEN"]),
    # Impossible or surprising plans.
    ("plan", ["model=13b", "cluster=local"], 2, ["model=13b does not fit", "cluster.mem_per_node_gb"]),
    (
        "plan",
        ["model=7b", "cluster=2node", "cluster.gpus_per_node=6", "parallelism.tp=4"],
        2,
        ["parallelism.tp=4"],
    ),
    (
        "plan",
        ["model=7b", "cluster=1node", "parallelism=fsdp", "parallelism.tp=8"],
        2,
        ["parallelism.tp=8", "fsdp"],
    ),
    ("plan", ["launcher.master_port=70000"], 2, ["launcher.master_port=70000", "1024-65535"]),
    (
        "plan",
        ["storage=nvme_s3", "storage.s3_bucket=My_Checkpoints"],
        2,
        ["storage.s3_bucket='My_Checkpoints'"],
    ),
    ("plan", ["storage=nvme_s3", "storage.s3_bucket=s3://team/llama"], 2, ["storage.s3_prefix=llama"]),
    ("plan", ["data=tokens", "data.path=/nonexistent/tokens", "launcher.dry_run=true"], 2, ["data.path="]),
    ("plan", ["train.global_batch_size=7"], 2, ["train.global_batch_size=7"]),
    # The error names the field the user set.
    ("field", ["model=13b", "cluster=1node", "parallelism.pp=100"], 2, ["parallelism.pp=100", "n_layers=40"]),
    ("field", ["train.lr=-0.001"], 2, ["train.lr=-0.001", "must be > 0"]),
    (
        "field",
        ["parallelism.mode=zero3"],
        2,
        ["parallelism.mode='zero3'", "auto, fsdp, hsdp, fsdp_tp, fsdp_tp_pp"],
    ),
    # Hydra's grammar and composition errors: one line, with the way out.
    ("hydra", ["model=7б"], 2, ["model=7б", "quote", "'model=\"7б\"'", "13b", "tiny"]),
    ("hydra", ["launcher.job_name=café-λ"], 2, ["launcher.job_name", "'launcher.job_name=\"café-λ\"'"]),
    ("hydra", ["model=bogus"], 2, ["unknown model option 'bogus'", "13b", "tiny"]),
    ("hydra", ["model.dim=abc"], 2, ["model.dim=abc", "Integer"]),
    ("hydra", ["model.nosuch=1"], 2, ["model.nosuch"]),
    ("hydra", ["model"], 2, ["model"]),
    # Run dir paths the filesystem cannot hold.
    ("run_dir", [f"launcher.run_dir=/tmp/{'x' * 300}"], 2, ["launcher.run_dir=", "255"]),
    (
        "run_dir",
        ["launcher.run_dir=/tmp/" + "/".join(["y" * 200] * 25)],
        2,
        ["launcher.run_dir=", "PATH_MAX"],
    ),
    ("run_dir", ["launcher.run_dir=/etc/hostname/run"], 2, ["launcher.run_dir=", "not a directory"]),
]


@pytest.mark.parametrize(
    ("kind", "args", "code", "expected"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)]
)
def test_refused_before_anything_is_written(
    tmp_path: Path, kind: str, args: list[str], code: int, expected: list[str]
) -> None:
    proc, cwd, calls = fake_sbatch_cli(tmp_path, *args)
    assert_refused(proc, cwd, calls, code, expected)
    assert not os.path.exists(MARK)


@pytest.mark.parametrize(
    ("conf", "expected"),
    [
        ("/nonexistent/slurm.conf", ["SLURM_CONF=/nonexistent/slurm.conf does not exist"]),
        (None, ["SLURM_CONF is unset", "/etc/slurm/slurm.conf"]),
    ],
)
def test_unconfigured_slurm_says_which_file(tmp_path: Path, conf: str | None, expected: list[str]) -> None:
    """Slurm installed but not configured: one line naming the missing file,
    exit 3, nothing written or submitted (not a CalledProcessError from sinfo)."""
    proc, cwd, calls = fake_sbatch_cli(
        tmp_path, *SLURM, env={"SLURM_CONF": conf} if conf else {}, unset=["SLURM_CONF"]
    )
    assert_refused(proc, cwd, calls, 3, expected)


def test_sweep_with_no_valid_point_exits_non_zero_and_leaves_nothing(tmp_path: Path) -> None:
    proc, cwd, calls = fake_sbatch_cli(
        tmp_path, "-m", "train.global_batch_size=7,9", "model=tiny,bogus", "launcher.dry_run=true"
    )
    assert_refused(proc, cwd, calls, 2, ["sweep of 4:", "4 invalid", "0 failed", "nothing was written"])
    # A dry-run sweep's table: every row refused, each distinct reason once below it.
    assert (
        proc.stdout.count("  no: ") == 4
        and "refused (points #1, #3): In 'config': Could not find" in proc.stdout
    )
    assert "model/bogus" in proc.stdout and "train.global_batch_size=7 is invalid" in proc.stdout


def test_sweep_against_unconfigured_slurm_is_one_line_per_point(tmp_path: Path) -> None:
    """A mixed Slurm sweep: the invalid point is counted invalid, the valid
    one failed (Slurm not configured), exit 3, no sinfo traceback, nothing left."""
    proc, cwd, calls = fake_sbatch_cli(
        tmp_path,
        "-m",
        *SLURM,
        "parallelism.tp=1,3",
        env={"SLURM_CONF": str(tmp_path / "missing.conf")},
    )
    assert_refused(proc, cwd, calls, 3, ["1 invalid", "1 failed", "0 submitted", "parallelism.tp=3"])
    assert proc.stdout.count("does not exist") == 1


def test_mixed_dry_run_sweep_counts_and_exits_zero(tmp_path: Path) -> None:
    proc, cwd, calls = fake_sbatch_cli(tmp_path, "-m", "launcher.dry_run=true", "train.global_batch_size=7,8")
    assert proc.returncode == 0, proc.stderr
    assert "2 dry run" not in proc.stdout and "1 dry run; 1 invalid; 0 failed" in proc.stdout
    assert list(cwd.iterdir()) == [] and not calls.exists()
