"""The status view of a real sweep on the local test cluster: ``--watch``
refreshes one table of every point until all have ended, the final table
holds each point's state, step, loss, tokens/s and restarts from its run,
``--png`` plots the curves of every point, and every point wrote its own
TensorBoard event files."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from testcluster_util import require_test_cluster

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_sweep_status_watch_table_and_png(tmp_path: Path) -> None:
    env = dict(os.environ, SLURM_CONF=require_test_cluster(), PYTHONPATH=str(ROOT))
    sweep = tmp_path / "sweep"
    sub = subprocess.run(
        [sys.executable, "-m", "launcher", "-m", "cluster=testcluster", "cluster.nodes=1"]
        + ["cluster.gpus_per_node=2", "launcher.exclusive=false", "qos.time_limit_min=5"]
        + ["train.steps=10", "train.lr=0.001,0.004", f"hydra.sweep.dir={sweep}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert sub.returncode == 0, sub.stdout + sub.stderr
    points = json.loads((sweep / "manifest.json").read_text())["points"]
    assert [p["status"] for p in points] == ["submitted", "submitted"], points

    # --watch returns by itself once every point has ended.
    watch = subprocess.run(
        [sys.executable, "-m", "launcher.status", str(sweep), "--watch", "3"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert watch.returncode == 0, watch.stderr
    tables = [t for t in watch.stdout.split("\n\n") if "ETTR" in t]
    assert len(tables) >= 2, watch.stdout  # refreshed while the points ran
    final = tables[-1].splitlines()
    head = final[1].split()[:-1]  # "RUN DIR": one column, two words, last
    assert head[:4] == ["RUN", "PROGRAM", "JOB", "STATE"] and "STEP" in head and "LOSS" in head, head
    rows = {r.split()[0]: dict(zip(head, r.split(), strict=False)) for r in final[2:]}
    # Each row is named by its swept value.
    assert sorted(rows) == ["train.lr=0.001", "train.lr=0.004"], rows
    for p in points:
        row = rows[f"train.lr={('0.001', '0.004')[p['point']]}"]
        metrics = [json.loads(x) for x in (Path(p["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
        last = [m for m in metrics if "loss" in m][-1]
        assert row["JOB"] == p["job_id"] and row["STATE"] == "COMPLETED" and row["RESTARTS"] == "0", row
        assert row["STEP"] == "10/10" and str(last["step"]) == "10", row
        assert row["LOSS"] == f"{last['loss']:.4f}" and row["TOK/S"] == f"{last['tokens_per_s']:.0f}", row
        # Each point's own TensorBoard event files hold its curve.
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(str(Path(p["run_dir"]) / "tensorboard"))
        acc.Reload()
        tb = {e.step: e.value for e in acc.Scalars("train/loss")}
        assert tb[10] == pytest.approx(last["loss"], rel=1e-6)
    # Different learning rates: different losses (the rows are the points' own).
    assert rows["train.lr=0.001"]["LOSS"] != rows["train.lr=0.004"]["LOSS"]

    png = tmp_path / "sweep.png"
    plot = subprocess.run(
        [sys.executable, "-m", "launcher.cli", "status", str(sweep), "--png", str(png)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert plot.returncode == 0, plot.stderr
    assert re.search(rf"plotted 2 run\(s\) to {re.escape(str(png))}", plot.stdout)
    from PIL import Image

    img = Image.open(png).convert("RGB")
    assert img.size == (1100, 400)
    # Two curves per panel in matplotlib's first two colours (C0 blue, C1 orange).
    colours = {c for _, c in img.getcolors(maxcolors=1 << 20)}
    assert (31, 119, 180) in colours and (255, 127, 14) in colours
    # Each panel has lines: left (loss) and right (tokens/s) halves both hold C0 and C1.
    for box in ((0, 0, 550, 400), (550, 0, 1100, 400)):
        half = {c for _, c in img.crop(box).getcolors(maxcolors=1 << 20)}
        assert {(31, 119, 180), (255, 127, 14)} <= half, box
