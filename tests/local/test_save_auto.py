"""storage.save_every_steps=auto (launcher/config/saveauto.py): the
launcher's Young/Daly interval from the runs root's fault history or the
published prior, the trainer re-tuning it from measured saves
(train/checkpoint/autointerval.py), and ``meshrun status``'s P50 / P90
finish (launcher/views/runforecast.py).
Tests that start no process: tests/unit/test_save_auto_units.py."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

from harness import launch

REPO = Path(__file__).resolve().parents[2]
TINY = ["cluster=local", "model=tiny", "train.tensorboard=false"]


def _launch(*overrides: str) -> subprocess.CompletedProcess[str]:
    return launch(*TINY, *overrides)


def _history(root: Path, faults: int, gpu_h: float) -> None:
    """A past run under the runs root, in the real files: goodput.json's
    allocated GPU-seconds and faults.jsonl's fault records."""
    d = root / "tiny-local" / "past"
    d.mkdir(parents=True)
    (d / "goodput.json").write_text(json.dumps({"allocated_gpu_s": gpu_h * 3600, "ettr": 0.5}))
    rec = json.dumps({"cause": "node_failure", "node": "n1", "action": "restart", "error": "lost"})
    (d / "faults.jsonl").write_text((rec + "\n") * faults)


def _flat(out: str) -> str:
    """The dry run's table as one line of words (rich wraps the cells)."""
    return " ".join(w for w in out.split() if w not in "│┃")


def _auto_steps(out: str) -> int:
    m = re.search(r"every (\d+) steps, auto", out)
    assert m, out
    return int(m.group(1))


def test_auto_saves_more_often_with_more_failures_in_the_history(tmp_path: Path) -> None:
    empty, faulty = tmp_path / "empty", tmp_path / "faulty"
    empty.mkdir()
    _history(faulty, faults=500, gpu_h=10)
    args = ["storage.save_every_steps=auto", "train.steps=10000000", "launcher.dry_run=true"]
    prior = _launch(*args, f"launcher.runs_root={empty}")
    hist = _launch(*args, f"launcher.runs_root={faulty}")
    assert prior.returncode == 0 and hist.returncode == 0, prior.stderr + hist.stderr
    assert "MTBF from the prior: MTTF 7.9 h at 1,024 GPUs" in _flat(prior.stdout)
    assert "from the 500 fault(s) in 10.0 GPU-h under" in _flat(hist.stdout)
    # 501 / 8,100 failures per GPU-hour against 1 / 8,090: ~22x shorter MTBF, ~4.7x shorter interval.
    assert _auto_steps(hist.stdout) * 4 < _auto_steps(prior.stdout)


def test_other_words_are_refused_naming_the_field(tmp_path: Path) -> None:
    p = _launch("storage.save_every_steps=often", f"launcher.runs_root={tmp_path}")
    assert p.returncode != 0
    assert "storage.save_every_steps='often' is invalid: must be an integer >= 1, or 'auto'" in p.stderr
    assert not any(tmp_path.iterdir())  # nothing written


def test_auto_run_logs_and_retunes_its_interval_and_status_forecasts(tmp_path: Path) -> None:
    root = tmp_path / "root"
    # 100,000 faults in 0.01 GPU-h: an MTBF of minutes on 2 ranks, so the
    # interval lands inside 1..train.steps, not at its cap.
    _history(root, faults=100_000, gpu_h=0.01)
    run_dir = root / "run"
    p = _launch(
        f"launcher.runs_root={root}",
        f"launcher.run_dir={run_dir}",
        "train.steps=150",
        "train.log_every_steps=5",
        "storage.save_every_steps=auto",
        "storage.save_every_min=0.01",  # time-based saves too: measured early
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    tuned = [r for r in recs if r.get("event") == "save_interval"]
    saves = [r for r in recs if r.get("event") == "checkpoint"]
    first, measured = tuned[0], tuned[1:]
    assert first["basis"] == "predicted" and "100000 fault(s)" in first["mtbf_source"]
    assert 1 <= first["min_steps"] <= first["steps"] <= first["max_steps"] <= 150
    assert first["steps"] < 150  # Young/Daly, not the cap
    assert measured and all(r["basis"] == "measured" for r in measured)
    assert len(measured) >= len(saves) - 1  # after every save but the last step's
    for r in measured:
        # The formula applied to the logged inputs, clamped to the plan's bounds.
        want = round(math.sqrt(2 * r["save_cost_s"] * r["mtbf_s"]) / r["step_s"])
        assert r["steps"] == max(r["min_steps"], min(r["max_steps"], want)), r
    # The first re-tune follows the first save, whose rank-0 stall it covers.
    assert measured[0]["last_save_s"] >= saves[0]["save_s"] * 0.999
    assert measured[0]["save_cost_s"] == measured[0]["last_save_s"]  # the mean of one save
    assert "save interval (auto): every" in p.stdout

    done = subprocess.run(
        [sys.executable, "-m", "launcher.status", str(run_dir)], capture_output=True, text=True, cwd=REPO
    )
    assert done.returncode == 0 and "finished in" in done.stdout, done.stdout + done.stderr
    # The same run seen half way (its newest lines not yet written), plus a torn line.
    half = tmp_path / "half"
    shutil.copytree(run_dir, half, ignore=shutil.ignore_patterns("checkpoints"))
    (half / "result.json").unlink()
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    cut = next(i for i, x in enumerate(lines) if '"step": 75,' in x)
    (half / "metrics.jsonl").write_text("\n".join(lines[: cut + 1]) + '\n{"step": 7')
    mid = subprocess.run(
        [sys.executable, "-m", "launcher.status", str(half)], capture_output=True, text=True, cwd=REPO
    )
    assert mid.returncode == 0, mid.stderr
    m = re.search(r"finish P50 ([\d.e+-]+) (min|h) / P90 ([\d.e+-]+) (min|h)", mid.stdout)
    assert m, mid.stdout
    p50, p90 = (float(m.group(i)) * (60 if m.group(i + 1) == "h" else 1) for i in (1, 3))
    assert 0 < p50 <= p90
    assert "step 75/150" in mid.stdout and "restart 600 s (prior)" in mid.stdout
    assert "1 unreadable record(s) skipped" in mid.stdout

    # The fleet: the same half-way run as a running Slurm job (sacct's answer recorded).
    from launcher.views import fleetrows as fleet
    from launcher.views import fleettext

    fleet_root = tmp_path / "fleet"
    shutil.copytree(half, fleet_root / "r")
    (fleet_root / "r" / "slurm").mkdir(exist_ok=True)
    (fleet_root / "r" / "slurm" / "job.json").write_text(json.dumps({"job_id": "77"}))
    rows = [{"JobID": "77", "State": "RUNNING", "Submit": "900", "Start": "1000", "End": "Unknown",
             "NNodes": "1", "AllocTRES": "cpu=2", "User": "alice", "QOS": "research", "Partition": "debug"}]  # fmt: skip

    class Recorded:
        calls, error = 0, None

        def fetch(self, job_ids: list[str]) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
            return [r for r in rows if r["JobID"] in job_ids], []

    view = fleet.collect(fleet_root, Recorded(), write=False, now=2000.0)  # type: ignore[arg-type]
    (row,) = view.runs
    assert row.state == "RUNNING" and row.finish_p50_h is not None and row.finish_p90_h is not None
    assert 0 < row.finish_p50_h <= row.finish_p90_h
    assert "FINISH P50 / P90" in fleettext.format_view(view) and row.finish in fleettext.format_view(view)
    assert view.to_json()["runs"][0]["finish_p90_h"] == row.finish_p90_h
