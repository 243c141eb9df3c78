"""The real path: ``python -m launcher`` (Hydra) -> local ranks -> ``python -m
train`` with S3 (moto's HTTP server): save, lose the node's disk, resume from
S3 at another layout (FSDP dp2 -> tensor parallel tp2), losses continue."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from harness import free_port, launch_in, s3_env

from launcher.config.runid import read_run_id

ACCESS_KEY = "AKIAMESHRUNTRAINERLEAK"
SECRET_KEY = "meshrunTrainerSecret/abcdef0123456789"


@pytest.fixture()
def s3_url():
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    boto3.client(
        "s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    ).create_bucket(Bucket="trainer")
    yield url
    server.stop()


def launch(run_dir: Path, url: str, *overrides: str) -> subprocess.CompletedProcess[str]:
    return launch_in(
        run_dir,
        "train.steps=10",
        "storage.save_every_steps=5",
        "storage.s3_bucket=trainer",
        f"storage.s3_endpoint_url={url}",
        *overrides,
        env=s3_env(ACCESS_KEY, SECRET_KEY),
    )


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_trainer_resumes_from_s3_at_other_layout(tmp_path: Path, s3_url: str) -> None:
    import boto3

    run_dir = tmp_path / "tr"
    first = launch(run_dir, s3_url, "parallelism=fsdp", "train.log_every_steps=1")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    ref = {r["step"]: r["loss"] for r in records(run_dir) if "loss" in r}
    s3 = boto3.client(
        "s3", endpoint_url=s3_url, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="trainer").get("Contents", [])]
    prefix = f"meshrun/{read_run_id(run_dir)}"  # the run id names the S3 prefix
    assert f"{prefix}/step_10/manifest.json" in keys and f"{prefix}/step_5/manifest.json" in keys, keys
    # The node's disk is gone and the newest remote copy is incomplete.
    shutil.rmtree(run_dir / "checkpoints")
    s3.delete_object(Bucket="trainer", Key=f"{prefix}/step_10/manifest.json")
    (run_dir / "metrics.jsonl").write_text("")
    # ... and the run did not finish (a finished run started again trains nothing).
    (run_dir / "result.json").unlink()
    second = launch(run_dir, s3_url, "parallelism=fsdp_tp", "parallelism.tp=2", "train.log_every_steps=1")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    recs = records(run_dir)
    assert [r["step"] for r in recs if r.get("event") == "resume"] == [5]
    again = {r["step"]: r["loss"] for r in recs if "loss" in r}
    assert sorted(again) == [6, 7, 8, 9, 10]
    for step, loss in again.items():
        assert loss == pytest.approx(ref[step], rel=1e-5, abs=1e-5), (step, loss, ref[step])
    logs = "".join(p.read_text() for p in (run_dir / "logs").glob("*.log"))
    assert f"fetched step 5 from s3://trainer/{prefix}" in logs, logs[-3000:]
    assert "saved on 2 ranks" in logs
    # No credential in anything the run wrote, nor in what the launcher printed.
    outputs = [first.stdout, first.stderr, second.stdout, second.stderr]
    outputs += [p.read_bytes().decode(errors="replace") for p in run_dir.rglob("*") if p.is_file()]
    for text in outputs:
        assert ACCESS_KEY not in text and SECRET_KEY not in text
