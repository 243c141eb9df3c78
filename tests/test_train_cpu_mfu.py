"""The trainer's logged MFU on CPU ranks, through a real local run
(``python -m launcher``, 2 gloo ranks): a share of the same measured peak
that ``python -m launcher.predict`` uses for that run (launcher/cpu_peak.py's
cached probe), so it is above 0, below 1, and close to the predicted MFU."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.perf import predict
from launcher.perf.cpu_runs import COMMON, SMALL
from launcher.spec import load_spec

REPO = Path(__file__).resolve().parent.parent


def test_cpu_run_logs_mfu_against_the_models_peak(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    overrides = [
        *COMMON,
        *SMALL,
        "train.steps=5",
        "cluster.local_processes=2",
        "parallelism=fsdp",
        "parallelism.activation_checkpointing=none",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "launcher", f"launcher.run_dir={run_dir}", *overrides],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    steps = [
        r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "event" not in r
    ]
    assert len(steps) == 5
    spec = load_spec(run_dir)
    pred = predict(spec.cfg, spec.plan)
    assert spec.plan.device == "cpu" and pred.peak_tflops > 0
    for r in steps:
        assert 0 < r["mfu"] < 1, r
        # The peak the logged MFU divides by is the model's, to rounding.
        peak = r["tokens_per_s_per_gpu"] * spec.plan.flops_per_token / r["mfu"] / 1e12
        assert peak == pytest.approx(pred.peak_tflops, rel=1e-9)
    # Same peak, so logged / predicted MFU = predicted / measured step time:
    # within the CPU model's error on this shared host, not an order apart.
    logged = statistics.median(r["mfu"] for r in steps[2:])
    assert pred.mfu / 3 < logged < pred.mfu * 3, (logged, pred.mfu)
    assert "mfu " in (run_dir / "logs" / "rank0.log").read_text()
