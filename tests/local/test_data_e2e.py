"""End to end through `python -m launcher` (2 gloo ranks, FSDP): data=tokens
resumes mid-epoch with the same batches, data=images trains model=vit_tiny."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
from harness import records_by_step, trained, write_images

REPO = Path(__file__).resolve().parents[2]


def test_tokens_resume_continues_the_uninterrupted_run(tmp_path):
    rng = np.random.default_rng(1)
    (tmp_path / "text").mkdir()
    for i in range(3):
        words = [
            " ".join("abcdefgh"[j % 8] * int(k) for j, k in enumerate(rng.integers(1, 6, 4)))
            for _ in range(400)
        ]
        (tmp_path / "text" / f"{i}.txt").write_text(". ".join(words))
    shards = tmp_path / "shards"
    subprocess.run(
        [sys.executable, "scripts/prepare_tokens.py", str(tmp_path / "text"), "--out", str(shards)],
        check=True,
        cwd=REPO,
        capture_output=True,
    )
    args = ["data=tokens", f"data.path={shards}", "train.steps=12", "train.log_every_steps=1"]
    full = tmp_path / "full"
    proc = trained(full, *args, "storage.save_every_steps=6", "storage.async_save=false")
    assert "data wait" in proc.stdout
    straight = records_by_step(full)
    assert all(0 <= r["data_wait_pct"] < 100 and r["data_wait_s"] >= 0 for r in straight.values())

    # A copy of the run that stopped after the step-6 checkpoint, resumed.
    resumed = tmp_path / "resumed"
    shutil.copytree(full, resumed, ignore=shutil.ignore_patterns("result.json"))  # it did not finish
    for d in (resumed / "checkpoints").glob("step_*"):
        if int(d.name.split("_")[1]) > 6:
            shutil.rmtree(d)
    (resumed / "metrics.jsonl").write_text("")
    trained(resumed, *args, "storage.save_every_steps=100")
    after = records_by_step(resumed)
    assert sorted(after) == list(range(7, 13))
    for step in range(7, 13):
        assert abs(after[step]["loss"] - straight[step]["loss"]) < 1e-5, (step, after[step], straight[step])

    # dp 2 x tp 2 on 4 ranks: the same global batch, split by dp rank only
    # (the loader checks its dp rank against the trainer's mesh), so the
    # first loss (before any update) equals the dp-only run's.
    tp_run = tmp_path / "tp"
    trained(tp_run, *args[:2], "train.steps=1", "cluster.local_processes=4", "parallelism.tp=2")
    assert json.loads((tp_run / "plan.json").read_text())["tp"] == 2
    assert abs(records_by_step(tp_run)[1]["loss"] - straight[1]["loss"]) < 1e-5


def test_images_train_vit_tiny_with_fsdp(tmp_path):
    write_images(tmp_path / "images", classes=4, per_class=10)
    run_dir = tmp_path / "run"
    trained(
        run_dir,
        "data=images",
        "model=vit_tiny",
        f"data.path={tmp_path / 'images'}",
        "train.steps=6",
        "train.log_every_steps=1",
        "storage.save_every_steps=100",
    )
    plan = json.loads((run_dir / "plan.json").read_text())
    assert (plan["mode"], plan["dp_shard"]) == ("fsdp", 2)
    rows = records_by_step(run_dir)
    assert sorted(rows) == list(range(1, 7))
    assert all(np.isfinite(r["loss"]) and "data_wait_pct" in r for r in rows.values())
    assert json.loads((run_dir / "result.json").read_text())["status"] == "completed"
