"""Failure rate (history over a published prior), the Young/Daly interval
and the finish forecast (launcher/perf/reliability.py), and the dry run's
risk rows (launcher/plan/forecast.py).
Tests that start no process: tests/unit/test_reliability_units.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_dry_run_prints_the_risk_rows(tmp_path: Path) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "launcher", "model=13b", "cluster=4node", "launcher.dry_run=true",
         f"launcher.runs_root={tmp_path}"],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    out = " ".join(p.stdout.split())
    assert "MTBF 7.9 h for this job" not in out  # 32 GPUs, not 1,024
    mtbf = 7.9 * 1024 / 32
    assert f"MTBF {mtbf:.3g} h for this job (prior: MTTF 7.9 h at 1,024 GPUs" in out, out[-3000:]
    assert "Young/Daly: every" in out and "P50" in out and "P90" in out
    # The restart priced at the plan's size by the model bench_goodput.py uses.
    cells = " ".join(out.replace("│", " ").split())  # the table's wrapped cells as one text
    assert "each to restart (measured 12 s at 4 ranks + 2 s per doubling" in cells, out[-3000:]


def test_a_bad_site_prior_is_refused_naming_the_field(tmp_path: Path) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "launcher", "cluster.gpu_h_per_failure=-5", f"launcher.runs_root={tmp_path}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert p.returncode != 0
    assert "cluster.gpu_h_per_failure=-5.0 is invalid: must be > 0, or 0 for the published prior" in p.stderr
    assert not any(tmp_path.iterdir())
