"""Resume never silently falls back (the real trainer, ``python -m launcher``,
2 local ranks, S3 = moto on 127.0.0.1): a run saved to node-local storage
and S3; S3 then goes down. A restart cannot list S3: it retries, then fails
naming the tier instead of resuming without it; with
``launcher.resume=local_only`` it resumes from the local copies, saying so."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from harness import launch_in, s3_env
from loopback_s3 import BUCKET, S3Server


def launch(run_dir: Path, url: str, *overrides: str) -> subprocess.CompletedProcess[str]:
    return launch_in(
        run_dir,
        "storage.save_every_steps=2",
        f"storage.s3_bucket={BUCKET}",
        f"storage.s3_endpoint_url={url}",
        *overrides,
        env=s3_env(),
    )


def test_unlisted_tier_fails_the_start_unless_local_only(tmp_path: Path) -> None:
    s3 = S3Server()
    s3.start()
    try:
        s3.client().create_bucket(Bucket=BUCKET)
        run_dir = tmp_path / "run"
        first = launch(run_dir, s3.url, "train.steps=4")
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
        assert len(s3.keys("meshrun/")) > 0
    finally:
        s3.stop()
    # S3 is down now (its port refuses connections).
    second = launch(run_dir, s3.url, "train.steps=6")
    text = second.stdout + second.stderr
    assert second.returncode != 0, text[-3000:]
    assert f"cannot list the checkpoint tier s3://{BUCKET}/meshrun/" in text, text[-3000:]
    assert "after 3 attempts; not resuming without it" in text and "launcher.resume=local_only" in text
    assert "(attempt 2 of 3" in "".join(p.read_text() for p in (run_dir / "logs").glob("*.log"))
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert not [r for r in recs if "loss" in r and r["step"] > 4], "trained without the unlisted tier"

    third = launch(
        run_dir, s3.url, "train.steps=6", "launcher.resume=local_only", "storage.upload_timeout_min=0.05"
    )
    text = third.stdout + third.stderr
    # Uploads keep failing with S3 down; the training itself completes.
    assert "resuming from what is known without it (launcher.resume=local_only)" in "".join(
        p.read_text() for p in (run_dir / "logs").glob("*.log")
    )
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if r.get("event") == "resume"] == [4], text[-3000:]
    assert max(r["step"] for r in recs if "loss" in r) == 6
