"""Every bad input is refused before anything is written or submitted.

``python -m launcher`` runs as a subprocess in an empty working directory
with a fake ``sbatch`` (and ``squeue``) first on PATH that records its calls.
Each refusal must: exit with the documented code (2: refused input, 3: Slurm
failed), name the field and the value (and the choices for an enumeration),
print no traceback, leave the working directory empty (no Hydra ``.hydra/``,
no log, no run dir), call no ``sbatch``, and print no credential.

One case per class of issue 12: hostile strings, credentials, impossible
plans, errors naming the field set, Hydra grammar and composition errors,
run dir paths, an unconfigured Slurm; sweeps and failed submissions below.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from testcluster_util import require_test_cluster

ROOT = Path(__file__).resolve().parents[2]
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"  # AWS's documented example key
FAKE_SBATCH = """#!/bin/bash
echo "$@" >> "{calls}"
{body}
"""


def run_cli(
    tmp_path: Path,
    *args: str,
    sbatch: str = "exit 0",
    env: dict[str, str] | None = None,
    unset: list[str] = (),  # type: ignore[assignment]
    timeout: int = 120,
) -> tuple[subprocess.CompletedProcess[str], Path, Path]:
    """(process, working dir, sbatch calls file)."""
    cwd, bindir = tmp_path / "cwd", tmp_path / "bin"
    cwd.mkdir(exist_ok=True)
    bindir.mkdir(exist_ok=True)
    calls = tmp_path / "sbatch_calls"
    (bindir / "sbatch").write_text(FAKE_SBATCH.format(calls=calls, body=sbatch))
    (bindir / "squeue").write_text("#!/bin/bash\nexit 0\n")
    for f in ("sbatch", "squeue"):
        (bindir / f).chmod(0o755)
    full_env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", **(env or {})}
    for name in ["HYDRA_FULL_ERROR", *unset]:
        if name not in (env or {}):
            full_env.pop(name, None)
    proc = subprocess.run(
        [sys.executable, "-m", "launcher", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return proc, cwd, calls


def assert_refused(
    proc: subprocess.CompletedProcess[str], cwd: Path, calls: Path, code: int, expected: list[str]
) -> None:
    out = proc.stdout + proc.stderr
    assert proc.returncode == code, (proc.returncode, out)
    for text in expected:
        assert text in out, (text, out)
    assert "Traceback" not in out and "HYDRA_FULL_ERROR" not in out, out
    assert "meshrun: error:" in proc.stderr or "meshrun: sweep" in proc.stdout, out
    assert SECRET not in out
    left = sorted(str(p.relative_to(cwd)) for p in cwd.rglob("*"))
    assert left == [], f"left behind: {left}"
    assert not calls.exists(), f"sbatch was called: {calls.read_text()}"


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
    proc, cwd, calls = run_cli(tmp_path, *args)
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
    proc, cwd, calls = run_cli(
        tmp_path, *SLURM, env={"SLURM_CONF": conf} if conf else {}, unset=["SLURM_CONF"]
    )
    assert_refused(proc, cwd, calls, 3, expected)


def test_sweep_with_no_valid_point_exits_non_zero_and_leaves_nothing(tmp_path: Path) -> None:
    proc, cwd, calls = run_cli(
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
    proc, cwd, calls = run_cli(
        tmp_path,
        "-m",
        *SLURM,
        "parallelism.tp=1,3",
        env={"SLURM_CONF": str(tmp_path / "missing.conf")},
    )
    assert_refused(proc, cwd, calls, 3, ["1 invalid", "1 failed", "0 submitted", "parallelism.tp=3"])
    assert proc.stdout.count("does not exist") == 1


def test_mixed_dry_run_sweep_counts_and_exits_zero(tmp_path: Path) -> None:
    proc, cwd, calls = run_cli(tmp_path, "-m", "launcher.dry_run=true", "train.global_batch_size=7,8")
    assert proc.returncode == 0, proc.stderr
    assert "2 dry run" not in proc.stdout and "1 dry run; 1 invalid; 0 failed" in proc.stdout
    assert list(cwd.iterdir()) == [] and not calls.exists()


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
    proc, cwd, calls = run_cli(tmp_path, *SMALL, "qos.partition=nosuch", env=test_cluster)
    assert_refused(proc, cwd, calls, 2, ["qos.partition='nosuch'", "no such partition", "research"])


def test_failed_submission_removes_the_run_dir(tmp_path: Path, test_cluster: dict[str, str]) -> None:
    body = (
        'echo "sbatch: error: Batch job submission failed: Invalid account or account/partition '
        'combination specified" >&2; exit 1'
    )
    proc, cwd, calls = run_cli(tmp_path, *SMALL, sbatch=body, env=test_cluster)
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
    proc, cwd, calls = run_cli(
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
    proc, cwd, calls = run_cli(
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
    proc, cwd, calls = run_cli(
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
    assert out.count("accounting/QOS policy") == 2 and "run dir removed" in out
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
    proc, cwd, calls = run_cli(
        tmp_path, *SMALL, "storage=nvme_s3", "storage.s3_bucket=ckpt-bucket", *args, env=env
    )
    assert_refused(proc, cwd, calls, 2, expected)
