"""Credentials never reach Slurm (docs/security.md), proven on the real test
cluster with one short container job (tiny model, 4 steps, S3 on moto):

The submitting shell exports AWS keys, a session token and a ``*_TOKEN``
variable (secret markers) next to a plain variable (the control marker).
The run reads S3 from a credentials file (``storage.s3_credentials_file``,
mode 600, profile picked by AWS_PROFILE) mounted read-only into the Pyxis
container; home is not mounted and the environment has no key, so a
completed upload proves the file was read. The control marker is found in
the controller's state directory, accounting (``sacct --env-vars``, the test
cluster's ``AccountingStoreFlags=job_env``) and every task's
``/proc/<pid>/environ`` (so each place is really looked at); the secret
markers are in none of them, nor in any file under the run dir (the batch
script included) or the slurmd spool.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from harness import cluster_base, job_id_from, launch, wait_jobs
from loopback_s3 import BUCKET, S3Server
from testcluster_util import CLUSTER_DIR, IMAGE, container_overrides, require_test_cluster

BASE = cluster_base(time_limit_min=3)

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_env")]
STEPS = 4


def job_env_in_accounting() -> bool:
    out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30).stdout
    return any(
        line.split("=", 1)[0].strip() == "AccountingStoreFlags" and "job_env" in line
        for line in out.splitlines()
    )


def task_environs(job: str) -> dict[int, bytes]:
    """pid -> environ of every process of the job (its SLURM_JOB_ID)."""
    out: dict[int, bytes] = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            env = (p / "environ").read_bytes()
            cmd = (p / "cmdline").read_bytes()
        except OSError:
            continue
        if f"SLURM_JOB_ID={job}\0".encode() in env:
            out[int(p.name)] = cmd + b"\n" + env
    return out


def files_holding(root: Path, markers: list[bytes]) -> list[str]:
    hits = []
    for p in root.rglob("*"):
        try:
            data = p.read_bytes() if p.is_file() and not p.is_symlink() else b""
        except OSError:
            continue
        hits += [f"{p}: {m.decode()}" for m in markers if m in data]
    return hits


def test_credentials_reach_the_job_from_a_file_and_nowhere_in_slurm(tmp_path: Path) -> None:
    require_test_cluster()
    from launcher.slurm.cluster import pyxis_available

    if not pyxis_available() or not os.path.isfile(IMAGE):
        pytest.skip(f"no Pyxis or no test image {IMAGE} on the test cluster (scripts/testcluster.sh start)")
    if not job_env_in_accounting():
        pytest.skip("the test cluster's slurm.conf lacks AccountingStoreFlags=job_env (restart it)")
    tag = uuid.uuid4().hex[:12]
    secret, token, key_id = f"SeCrEt{tag}x", f"SeSsIoN{tag}", f"AKIAZZ{tag.upper()[:10]}00"[:20]
    markers = [secret.encode(), token.encode(), key_id.encode(), f"HuB{tag}".encode()]
    plain = f"meshrun-plain-{tag}"
    s3 = S3Server(access_key=f"filekey{tag}", secret_key=f"filesecret{tag}")
    s3.start()
    try:
        s3.client().create_bucket(Bucket=BUCKET)
        creds = tmp_path / "aws" / "credentials"
        creds.parent.mkdir()
        creds.write_text(
            f"[meshrun-{tag}]\naws_access_key_id = {s3.access_key}\naws_secret_access_key = {s3.secret_key}\n"
        )
        creds.chmod(0o600)
        run_dir = tmp_path / "run"
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(
            AWS_ACCESS_KEY_ID=key_id,
            AWS_SECRET_ACCESS_KEY=secret,
            AWS_SESSION_TOKEN=token,
            MESHRUN_TEST_HUB_TOKEN=f"HuB{tag}",
            MESHRUN_PLAIN_PROBE=plain,
            AWS_PROFILE=f"meshrun-{tag}",  # not secret: passed on, picks the file's profile
            AWS_DEFAULT_REGION="us-east-1",
            AWS_CONFIG_FILE="/nonexistent",
            AWS_EC2_METADATA_DISABLED="true",
            PYTHONPATH=str(Path(__file__).resolve().parents[2]),
        )
        out = launch(
            *BASE,
            *container_overrides(),
            "cluster.nodes=1",
            "cluster.gpus_per_node=2",
            f"train.steps={STEPS}",
            "storage.save_every_steps=2",
            "storage.async_save=false",
            f"storage.s3_bucket={BUCKET}",
            f"storage.s3_endpoint_url={s3.url}",
            f"storage.s3_credentials_file={creds}",
            f"launcher.run_dir={run_dir}",
            f"launcher.runs_root={tmp_path}",
            cwd=tmp_path,
            env=env,
            timeout=120,
        )
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        assert "not passed to Slurm (credentials): AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY" in out.stdout
        job = job_id_from(out.stdout)

        # While it runs: the controller's stored job, the tasks' environments.
        state, environs, deadline = b"", {}, time.monotonic() + 240
        ctld = Path(CLUSTER_DIR) / "state" / "ctld"
        while time.monotonic() < deadline and not (run_dir / "result.json").exists():
            for d in ctld.glob(f"hash.*/job.{job}"):
                for f in d.iterdir():
                    state += f.read_bytes() if f.is_file() else b""
            environs.update(task_environs(job))
            time.sleep(0.3)
        rec = wait_jobs([job], 240)[job]
        err = "".join(p.read_text()[-1500:] for p in (run_dir / "slurm").glob("*_log.err"))
        assert rec.state == "COMPLETED", (rec, err)

        assert plain.encode() in state, "the controller's job state was not read"
        assert not [m for m in markers if m in state], "a credential is in the controller's state"
        trainers = [e for e in environs.values() if b"-m\0train\0" in e.split(b"\n", 1)[0]]
        assert len(trainers) >= 2, f"saw {len(environs)} processes of job {job}, {len(trainers)} trainers"
        for e in environs.values():
            assert plain.encode() in e and not [m for m in markers if m in e], e[:300]
        assert all(f"AWS_SHARED_CREDENTIALS_FILE={creds}\0".encode() in e for e in trainers)

        acct = subprocess.run(
            ["sacct", "-j", job, "--env-vars", "-n", "-P"], capture_output=True, text=True, timeout=30
        ).stdout
        assert plain in acct, acct[-2000:]
        assert not [m for m in markers if m.decode() in acct]
        assert files_holding(run_dir, markers) == []
        assert files_holding(Path(CLUSTER_DIR) / "state", markers) == []

        # The S3 copy came from the file's keys (no key anywhere else): committed steps.
        from launcher.config.runid import read_run_id

        assert STEPS in s3.complete_steps(read_run_id(str(run_dir))), s3.keys("meshrun/")
    finally:
        s3.stop()
