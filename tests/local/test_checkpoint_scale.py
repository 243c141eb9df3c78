"""Scale rehearsal, local part: Llama-3 8B's structure (conf/model/
llama3_8b_shape.yaml: 32 layers, GQA 32/8, untied; 1,164 tensors a rank with
AdamW under FSDP over 2 ranks) through the real trainer (``python -m
launcher``) with a stock descriptor limit (``ulimit -n 1024``), saving to
node-local storage and the loopback S3; the node's disk is then lost and the
newest remote copy is incomplete: the run resumes from S3 and its losses
equal the uninterrupted run's to 1e-6. (One staging buffer per tensor failed
every save here with "Too many open files".)"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
from pathlib import Path

from harness import launch_in, losses, s3_env
from loopback_s3 import BUCKET, S3Server

from launcher.config.runid import read_run_id


def launch(run_dir: Path, url: str) -> subprocess.CompletedProcess[str]:
    def stock_limits() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    return launch_in(
        run_dir,
        "model=llama3_8b_shape",
        "parallelism=fsdp",
        "train.steps=4",
        "train.log_every_steps=1",
        "storage.save_every_steps=2",
        f"storage.s3_bucket={BUCKET}",
        f"storage.s3_endpoint_url={url}",
        env=s3_env(),
        preexec_fn=stock_limits,
    )


def test_llama3_8b_shape_saves_uploads_and_resumes_from_s3_under_ulimit_1024(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    s3 = S3Server()
    s3.start()
    try:
        s3.client().create_bucket(Bucket=BUCKET)
        run_dir = tmp_path / "run"
        first = launch(run_dir, s3.url)
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
        assert "Too many open files" not in first.stdout + first.stderr
        ref = losses(run_dir)
        assert sorted(ref) == [1, 2, 3, 4]
        meta = dcp.FileSystemReader(str(run_dir / "checkpoints" / "step_4")).read_metadata()
        # 32 layers x 9 tensors + embedding, final norm, output; AdamW: step, exp_avg, exp_avg_sq.
        params = [k for k in meta.state_dict_metadata if k.startswith("model.")]
        assert len(params) == 32 * 9 + 3, len(params)
        tensors = [v for v in meta.state_dict_metadata.values() if isinstance(v, TensorStorageMetadata)]
        assert len(tensors) == 4 * len(params) == 1164, len(tensors)
        prefix = f"meshrun/{read_run_id(run_dir)}"
        assert f"{prefix}/step_4/manifest.json" in s3.keys(prefix)
        # The node's disk is gone and the newest remote copy is incomplete.
        shutil.rmtree(run_dir / "checkpoints")
        s3.client().delete_object(Bucket=BUCKET, Key=f"{prefix}/step_4/manifest.json")
        (run_dir / "metrics.jsonl").write_text("")
        # ... and the run did not finish (a finished run started again trains nothing).
        (run_dir / "result.json").unlink()
        second = launch(run_dir, s3.url)
        assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    finally:
        s3.stop()
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if r.get("event") == "resume"] == [2]
    again = losses(run_dir)
    assert sorted(again) == [3, 4]
    for step, loss in again.items():
        assert abs(loss - ref[step]) <= 1e-6, (step, loss, ref[step])
    logs = "".join(p.read_text() for p in (run_dir / "logs").glob("*.log"))
    assert "fetched step 2 from s3://" in logs
