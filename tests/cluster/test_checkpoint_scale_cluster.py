"""Scale rehearsal on the real Slurm test cluster: Llama-3's structure
(conf/model/llama3_8b_shape.yaml: 32 layers, GQA 32/8, untied, 1,164
tensors with AdamW; llama3_70b_shape.yaml: 80 layers, 2,892) with FSDP+TP
(TP inside a node, FSDP across 2 nodes x 2 ranks), every task under a stock
descriptor limit (``ulimit -n 1024``, set on the submitting process: Slurm
propagates it to the tasks), saving every step to node-local storage and the
loopback S3. While step 2 uploads a rank is SIGKILLed and the job
cancelled; the node-local copies are deleted; a new submission resumes from
S3 and its losses equal an uninterrupted run's (a concurrent job saving
node-local only) to 1e-6. Three steps, activation checkpointing off
(recompute costs CPU here and touches no saved state).

CI runs the 8B shape with FSDP+TP (2-D sharding; the 70B shape's 2.5x the
tensors doubled this test's time and tests the same path). The campaign
runs the matrix {8B, 70B} shape x {FSDP, FSDP+TP} with the same body:
``python -m pytest -s -m "" tests/cluster/test_checkpoint_scale_cluster.py``
(all four; ``-m campaign``: the three CI skips). Each prints a SCALE line:
tensors, the most one rank wrote, save-to-commit and restore seconds,
descriptors, manifest and DCP metadata bytes."""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import job_id_from, losses, wait_job
from loopback_s3 import BUCKET, S3Server

from launcher.config.runid import RUN_ID_FILE, read_run_id

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_env")]
STEPS = 3
PARALLELISM = {
    "fsdp": ["parallelism=fsdp"],
    "fsdp_tp": ["parallelism=fsdp_tp", "parallelism.tp=2", "parallelism.dp_shard=2"],
}
# (model, parallelism): CI runs the first; `-m campaign` the rest.
SCENARIOS = [
    pytest.param("llama3_8b_shape", "fsdp_tp", id="8b-fsdp_tp"),
    pytest.param("llama3_70b_shape", "fsdp_tp", id="70b-fsdp_tp", marks=pytest.mark.campaign),
    pytest.param("llama3_70b_shape", "fsdp", id="70b-fsdp", marks=pytest.mark.campaign),
    pytest.param("llama3_8b_shape", "fsdp", id="8b-fsdp", marks=pytest.mark.campaign),
]


def submit(run_dir: Path, url: str | None, cwd: Path, model: str, parallelism: str) -> str:
    """Submit the run (url None: node-local saves only, as the reference)."""

    def stock_limits() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_DEFAULT_REGION="us-east-1", AWS_CONFIG_FILE="/nonexistent", AWS_EC2_METADATA_DISABLED="true"
    )
    env["PYTHONPATH"] = str(ROOT)
    # The jobs' S3 keys: a credentials file, never the environment (Slurm would store it).
    creds = cwd / "aws-credentials"
    creds.write_text("[default]\naws_access_key_id = x\naws_secret_access_key = x\n")
    creds.chmod(0o600)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "launcher",
            "cluster=testcluster",
            f"model={model}",
            *PARALLELISM[parallelism],
            "cluster.nodes=2",
            "cluster.gpus_per_node=2",
            "launcher.exclusive=false",
            "qos.time_limit_min=10",
            f"train.steps={STEPS}",
            "train.log_every_steps=1",
            "storage.save_every_steps=1",
            # Recompute costs CPU here and touches no checkpoint state.
            "parallelism.activation_checkpointing=none",
            *(
                [
                    f"storage.s3_bucket={BUCKET}",
                    f"storage.s3_endpoint_url={url}",
                    f"storage.s3_credentials_file={creds}",
                ]
                if url
                else []
            ),
            f"launcher.run_dir={run_dir}",
            f"launcher.runs_root={cwd}",
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        preexec_fn=stock_limits,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return job_id_from(out.stdout)


def heartbeats(run_dir: Path) -> dict[int, dict]:
    from launcher.config.health import read_heartbeats

    return read_heartbeats(run_dir)


def dcp_shape(step_dir: Path) -> tuple[int, int, int]:
    """(tensors in the checkpoint, most tensor chunks one rank wrote, bytes
    of DCP's .metadata)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = dcp.FileSystemReader(str(step_dir)).read_metadata()
    tensors = sum(isinstance(v, TensorStorageMetadata) for v in meta.state_dict_metadata.values())
    per_file: dict[str, int] = {}
    for idx, info in meta.storage_data.items():
        if idx.fqn in meta.state_dict_metadata and isinstance(
            meta.state_dict_metadata[idx.fqn], TensorStorageMetadata
        ):
            per_file[info.relative_path] = per_file.get(info.relative_path, 0) + 1
    return tensors, max(per_file.values()), (step_dir / ".metadata").stat().st_size


def commit_seconds(run_dir: Path) -> list[float]:
    """Each save's seconds from its worker taking it to its commit (rank 0's
    checkpoint worker logs them)."""
    logs = "".join(p.read_text(errors="replace") for p in [*run_dir.glob("logs/*"), *run_dir.glob("slurm/*")])
    return [float(x) for x in re.findall(r"committed to \S+ \(.*?\) in ([0-9.]+) s", logs)]


def kill_during_upload(
    s3: S3Server, run_dir: Path, timeout: float
) -> tuple[tuple[str, float], list[int], str]:
    """Watch the run until step 2 uploads while step 1 is complete in S3 (a
    resume from step 1 redoes steps 2 and 3: its loss at step 3 checks the
    optimizer state too), then SIGKILL rank 1: ((step dir, seconds),
    descriptor counts seen, rank 1's /proc limits)."""
    t0 = time.monotonic()
    fds: list[int] = []
    limits = ""
    while time.monotonic() - t0 < timeout:
        hb = heartbeats(run_dir)
        for h in hb.values():
            try:
                fds.append(len(os.listdir(f"/proc/{h['pid']}/fd")))
                limits = limits or Path(f"/proc/{h['pid']}/limits").read_text()
            except OSError:
                pass
        if (run_dir / RUN_ID_FILE).exists():
            prefix = f"meshrun/{read_run_id(run_dir)}/"
            keys = s3.keys(prefix)
            done = {k[len(prefix) :].split("/")[0] for k in keys if k.endswith("/manifest.json")}
            uploading = {k[len(prefix) :].split("/")[0] for k in keys if "/g" in k} - done
            assert not done - {"step_1"}, f"step 2's upload was never seen in flight: {sorted(done)}"
            if done and "step_2" in uploading and 1 in hb:
                os.kill(hb[1]["pid"], signal.SIGKILL)
                return ("step_2", time.monotonic() - t0), fds, limits
        time.sleep(0.05)
    raise AssertionError(f"no upload was seen in flight in {timeout} s")


@pytest.mark.parametrize(("model", "parallelism"), SCENARIOS)
def test_two_nodes_sigkill_during_upload_resumes_from_s3(
    tmp_path: Path, model: str, parallelism: str
) -> None:
    s3 = S3Server()
    s3.start()
    jobs: list[str] = []
    try:
        s3.client().create_bucket(Bucket=BUCKET)
        ref_dir, run_dir = tmp_path / "ref", tmp_path / "run"
        # The reference saves node-local only: the loopback S3 serves the run.
        jobs.append(ref_job := submit(ref_dir, None, tmp_path, model, parallelism))
        jobs.append(job := submit(run_dir, s3.url, tmp_path, model, parallelism))
        killed, fds, limits = kill_during_upload(s3, run_dir, 480)
        subprocess.run(["scancel", job], timeout=30)
        assert wait_job(job, 120)["state"] in ("CANCELLED", "FAILED", "NODE_FAIL")
        assert wait_job(ref_job, 300)["state"] == "COMPLETED"
        run_id = read_run_id(run_dir)
        remote = s3.complete_steps(run_id)
        manifest = s3.client().get_object(
            Bucket=BUCKET, Key=f"meshrun/{run_id}/step_{max(remote)}/manifest.json"
        )
        manifest_bytes = len(manifest["Body"].read())
        # The node-local copies are gone; a new submission resumes from S3.
        shutil.rmtree(run_dir / "checkpoints")
        (run_dir / "metrics.jsonl").write_text("")
        t1 = time.monotonic()
        jobs.append(again := submit(run_dir, s3.url, tmp_path, model, parallelism))
        assert wait_job(again, 420)["state"] == "COMPLETED", (
            run_dir / "slurm" / f"{again}_0_log.err"
        ).read_text()[-3000:]
        resume_s = time.monotonic() - t1
    finally:
        subprocess.run(["scancel", *jobs], timeout=30)  # none left behind when a check fails
        s3.stop()
    assert "Max open files            1024" in limits, limits
    assert fds and max(fds) < 1024
    ref = losses(ref_dir)
    assert sorted(ref) == list(range(1, STEPS + 1))
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    resumed = [r for r in recs if r.get("event") == "resume"]
    # Step 2's upload may still finish (a small checkpoint, the other node's
    # uploader) before the job ends: the newest complete step is resumed.
    assert remote in ([1], [1, 2]) and [r["step"] for r in resumed] == [max(remote)], (resumed, remote)
    start = resumed[0]["step"]
    got = losses(run_dir)
    assert sorted(got) == list(range(start + 1, STEPS + 1)), got
    for step, loss in got.items():
        assert abs(loss - ref[step]) <= 1e-6, (step, loss, ref[step])
    logs = "".join(
        p.read_text(errors="replace") for p in [*run_dir.glob("logs/*.log"), *run_dir.glob("slurm/*")]
    )
    assert f"fetched step {start} from s3://" in logs
    tensors, per_rank, metadata_bytes = dcp_shape(ref_dir / "checkpoints" / f"step_{STEPS}")
    saves = commit_seconds(ref_dir)
    assert saves, "rank 0's checkpoint worker logged no commit"
    print(
        f"SCALE {model} {parallelism}: {tensors} tensors, at most {per_rank} written by one rank; "
        f"save to commit {min(saves):.1f}-{max(saves):.1f} s ({len(saves)} saves); "
        f"killed rank 1 with {killed[0]} uploading at {killed[1]:.1f} s; remote complete {remote}; "
        f"resumed from {start} (restore {resumed[0]['restore_s']:.1f} s); resume submission to "
        f"completion {resume_s:.1f} s; fds per rank max {max(fds)}; manifest {manifest_bytes} B; "
        f"DCP metadata {metadata_bytes} B"
    )
