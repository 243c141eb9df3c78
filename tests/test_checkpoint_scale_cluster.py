"""Scale rehearsal on the real Slurm test cluster: Llama-3 8B's structure
(conf/model/llama3_8b_shape.yaml, 1,164 tensors a rank) with FSDP over 2
nodes x 2 ranks, every task under a stock descriptor limit (``ulimit -n
1024``, set on the submitting process: Slurm propagates it to the tasks),
saving to node-local storage and the loopback S3. While an upload is in
flight a rank is SIGKILLed and the job cancelled; the node-local copies are
deleted; a new submission resumes from S3 and its losses equal an
uninterrupted run's to 1e-6."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from loopback_s3 import BUCKET, S3Server

from launcher.config.runid import RUN_ID_FILE, read_run_id

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_env")]
STEPS = 6


def submit(run_dir: Path, url: str, cwd: Path) -> str:
    def stock_limits() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="x", AWS_DEFAULT_REGION="us-east-1")
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "launcher",
            "cluster=testcluster",
            "model=llama3_8b_shape",
            "parallelism=fsdp",
            "cluster.nodes=2",
            "cluster.gpus_per_node=2",
            "launcher.exclusive=false",
            "qos.time_limit_min=5",
            f"train.steps={STEPS}",
            "train.log_every_steps=1",
            "storage.save_every_steps=2",
            f"storage.s3_bucket={BUCKET}",
            f"storage.s3_endpoint_url={url}",
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
    for line in out.stdout.splitlines():
        if line.startswith("meshrun: submitted job "):
            return line.split()[3].rstrip(":")
    raise AssertionError(out.stdout)


def ended(job: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        q = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, timeout=30
        )
        if not q.stdout.strip():
            out = subprocess.run(
                ["sacct", "-X", "-n", "-P", "-j", job, "-o", "State"],
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout.split("\n")[0]
            if out:
                return out.split()[0]
        time.sleep(1)
    raise AssertionError(f"job {job} not finished after {timeout} s")


def losses(run_dir: Path) -> dict[int, float]:
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {r["step"]: r["loss"] for r in recs if "loss" in r and r.get("event") is None}


def heartbeats(run_dir: Path) -> dict[int, dict]:
    out = {}
    for p in (run_dir / "heartbeats").glob("rank*.json"):
        with contextlib.suppress(ValueError, OSError):
            out[int(p.stem[4:])] = json.loads(p.read_text())
    return out


def test_llama3_8b_shape_on_two_nodes_sigkill_during_upload_resumes_from_s3(tmp_path: Path) -> None:
    s3 = S3Server()
    s3.start()
    try:
        s3.client().create_bucket(Bucket=BUCKET)
        ref_dir, run_dir = tmp_path / "ref", tmp_path / "run"
        ref_job = submit(ref_dir, s3.url, tmp_path)
        job = submit(run_dir, s3.url, tmp_path)
        # Wait for an upload in flight: a step's objects in S3, its manifest not yet.
        t0 = time.monotonic()
        fds: list[int] = []
        limits = ""
        killed = None
        while time.monotonic() - t0 < 150 and killed is None:
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
                for k in keys:
                    step_dir = k[len(prefix) :].split("/")[0]
                    # A newer step uploading while an older one is complete in S3.
                    if done and "/g" in k and step_dir not in done and 1 in hb:
                        os.kill(hb[1]["pid"], signal.SIGKILL)
                        killed = (step_dir, time.monotonic() - t0)
                        break
            time.sleep(0.05)
        assert killed is not None, "no upload was ever seen in flight"
        subprocess.run(["scancel", job], timeout=30)
        assert ended(job, 120) in ("CANCELLED", "FAILED", "NODE_FAIL")
        assert ended(ref_job, 240) == "COMPLETED"
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
        again = submit(run_dir, s3.url, tmp_path)
        assert ended(again, 240) == "COMPLETED", (run_dir / "slurm" / f"{again}_0_log.err").read_text()[
            -3000:
        ]
        resume_s = time.monotonic() - t1
    finally:
        s3.stop()
    assert "Max open files            1024" in limits, limits
    assert fds and max(fds) < 1024
    ref = losses(ref_dir)
    assert sorted(ref) == list(range(1, STEPS + 1))
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    resumed = [r["step"] for r in recs if r.get("event") == "resume"]
    assert resumed and resumed[0] in remote and resumed[0] == max(remote), (resumed, remote)
    got = losses(run_dir)
    assert sorted(got) == list(range(resumed[0] + 1, STEPS + 1)), got
    for step, loss in got.items():
        assert abs(loss - ref[step]) <= 1e-6, (step, loss, ref[step])
    logs = "".join(
        p.read_text(errors="replace") for p in [*run_dir.glob("logs/*.log"), *run_dir.glob("slurm/*")]
    )
    assert f"fetched step {resumed[0]} from s3://" in logs
    print(
        f"SCALE: killed rank 1 with {killed[0]} uploading at {killed[1]:.1f} s; remote complete {remote}; "
        f"resumed from {resumed[0]}; resume submission to completion {resume_s:.1f} s; "
        f"fds per rank max {max(fds)}; manifest {manifest_bytes} B"
    )
