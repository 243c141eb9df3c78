"""The main job: `python -m launcher` on the local default (2 gloo ranks),
through the same `python -m train` entry point a Slurm task runs."""

from __future__ import annotations

import json
from pathlib import Path

from harness import launch_in, step_records


def test_default_local_run_trains_then_resumes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = launch_in(run_dir, "train.steps=20", "storage.save_every_steps=10")
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    assert "step 20/20" in first.stdout  # rank 0's progress reached the terminal
    for name in ("config.yaml", "plan.json", "spec.json", "metrics.jsonl", "result.json"):
        assert (run_dir / name).exists(), name
    assert (run_dir / "logs" / "rank1.log").exists()
    rows = step_records(run_dir)
    assert rows[-1]["step"] == 20
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.5, (rows[0], rows[-1])
    assert all(r["tokens_per_s"] > 0 for r in rows)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "completed" and result["final_step"] == 20
    plan = json.loads((run_dir / "plan.json").read_text())
    assert (plan["world_size"], plan["dp_shard"]) == (2, 2)

    # Same run dir, more steps: resumes from the step-20 checkpoint.
    second = launch_in(run_dir, "train.steps=30", "storage.save_every_steps=10")
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    resumes = [e for e in events if e.get("event") == "resume"]
    assert resumes and resumes[-1]["step"] == 20
    after = [r for r in step_records(run_dir) if r["step"] > 20]
    assert after[0]["step"] > 20 and after[-1]["step"] == 30
    assert json.loads((run_dir / "result.json").read_text())["final_step"] == 30
