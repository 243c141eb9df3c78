"""The Grafana dashboard: valid PromQL (promtool) over series the exporter
actually produces."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from launcher.views.goodput import SERIES as GOODPUT_SERIES
from train.observe.metrics import STEP_SERIES

ROOT = Path(__file__).resolve().parents[2]
EXPORTED = (
    {name for name, _, _ in STEP_SERIES.values()}
    | {
        "meshrun_collective_seconds",
        "meshrun_collective_calls",
        "meshrun_gpu_utilization_ratio",
        "meshrun_gpu_memory_used_bytes",
        "meshrun_gpu_memory_total_bytes",
        "meshrun_gpu_power_watts",
        "meshrun_gpu_nvlink_bytes_total",
    }
    | set(GOODPUT_SERIES.values())
)  # + goodput series: meshrun fleet --prom (launcher/views/goodput.py)


def exprs() -> list[str]:
    dash = json.loads((ROOT / "dashboards" / "meshrun.json").read_text())
    return [t["expr"] for p in dash["panels"] for t in p["targets"]]


def test_dashboard_uses_exported_series() -> None:
    used = {m for e in exprs() for m in re.findall(r"\bmeshrun_[a-z_]+", e)}
    assert used <= EXPORTED, used - EXPORTED
    for needed in (
        "meshrun_step_time_seconds",
        "meshrun_collective_seconds",
        "meshrun_data_wait_ratio",
        "meshrun_goodput_gpu_seconds",
        "meshrun_ettr_ratio",
    ):
        assert needed in used


@pytest.mark.skipif(shutil.which("promtool") is None, reason="Debian's prometheus package is not installed")
def test_dashboard_promql_is_valid(tmp_path: Path) -> None:
    rules = ["groups:", "  - name: dashboard", "    rules:"]
    for i, e in enumerate(exprs()):
        e = e.replace("$run", ".*").replace("$job_id", ".*").replace("$node", ".*")
        rules += [f"      - record: meshrun:panel{i}", f"        expr: {json.dumps(e)}"]
    path = tmp_path / "rules.yml"
    path.write_text("\n".join(rules) + "\n")
    p = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
