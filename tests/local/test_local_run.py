"""The main job: `python -m launcher` on the local default (2 gloo ranks),
through the same `python -m train` entry point a Slurm task runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "launcher", f"launcher.run_dir={run_dir}", *overrides],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )


def steps(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "loss" in r and "event" not in r]


def test_default_local_run_trains_then_resumes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = run(run_dir, "train.steps=20", "storage.save_every_steps=10")
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    assert "step 20/20" in first.stdout  # rank 0's progress reached the terminal
    for name in ("config.yaml", "plan.json", "spec.json", "metrics.jsonl", "result.json"):
        assert (run_dir / name).exists(), name
    assert (run_dir / "logs" / "rank1.log").exists()
    rows = steps(run_dir)
    assert rows[-1]["step"] == 20
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.5, (rows[0], rows[-1])
    assert all(r["tokens_per_s"] > 0 for r in rows)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "completed" and result["final_step"] == 20
    plan = json.loads((run_dir / "plan.json").read_text())
    assert (plan["world_size"], plan["dp_shard"]) == (2, 2)

    # Same run dir, more steps: resumes from the step-20 checkpoint.
    second = run(run_dir, "train.steps=30", "storage.save_every_steps=10")
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    resumes = [e for e in events if e.get("event") == "resume"]
    assert resumes and resumes[-1]["step"] == 20
    after = [r for r in steps(run_dir) if r["step"] > 20]
    assert after[0]["step"] > 20 and after[-1]["step"] == 30
    assert json.loads((run_dir / "result.json").read_text())["final_step"] == 30
