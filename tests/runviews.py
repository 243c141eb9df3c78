"""Issue 51's check, shared by the cluster tests of each program: at the end
of a run, ``meshrun status``, ``meshrun fleet --json``, the fleet page's JSON,
the API handle and goodput.json give one state, last step, restarts, faults,
redone steps and GPU-seconds, and the GPU-seconds are what sacct bills for
every job of the run (within 2%)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from harness import REPO


def status_row(run_dir: Path) -> dict[str, str]:
    """``meshrun status DIR``'s table, header to value."""
    out = subprocess.run(
        [sys.executable, "-m", "launcher.status", str(run_dir)],
        capture_output=True, text=True, timeout=120, cwd=REPO, env={**os.environ, "COLUMNS": "400"},
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    head, row = (re.split(r"\s{2,}", line.strip()) for line in out.stdout.splitlines()[:2])
    return dict(zip(head, row, strict=True))


def _fleet_row(root: Path, run_dir: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "launcher.fleet", str(root), "--json"],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [r for r in json.loads(out.stdout)["runs"] if Path(r["run_dir"]).resolve() == run_dir.resolve()]
    assert len(rows) == 1, out.stdout[-3000:]
    return rows[0]


def assert_views_agree(
    run_dir: Path, root: Path, jobs: list[str], *, state: str, step: int | None
) -> dict[str, dict[str, Any]]:
    """Every view of the run in ``run_dir`` (under the runs root ``root``,
    made of the Slurm ``jobs``) says ``state`` at ``step`` (None: a program
    that reports no steps, "-" on screen) and the same
    restarts, faults, redone steps and GPU-seconds. Returns the views read:
    ``status`` (the table's row), ``fleet`` (its JSON row) and ``goodput``."""
    from launcher.api import Run
    from launcher.slurm.cluster import accounting
    from launcher.views.fleetrows import collect
    from launcher.views.fleetweb import answer
    from launcher.views.goodput import attempts_from

    record = json.loads((run_dir / "slurm" / "job.json").read_text())
    assert [j["job_id"] for j in record["jobs"]] == jobs, record
    status = status_row(run_dir)
    fleet = _fleet_row(root, run_dir)
    body, _, _ = answer(collect(root, write=False), "/api/fleet.json")
    (page,) = [r for r in json.loads(body)["runs"] if Path(r["run_dir"]).resolve() == run_dir.resolve()]
    api = Run(str(run_dir), jobs[-1]).status()
    assert api.summary is not None
    g = json.loads((run_dir / "goodput.json").read_text())

    seen = (status, fleet, page, api.state, g["state"])
    assert status["STATE"] == fleet["state"] == page["state"] == api.state == g["state"] == state, seen
    assert status["STEP"].split("/")[0] == ("-" if step is None else str(step)), status
    assert fleet["step"] == page["step"] == api.summary.last_step == step, seen
    for name, key, n in (
        ("RESTARTS", "restarts", g["restarts"]),
        ("FAULTS", "faults", g["failures"]),
        ("REDONE", "redone", g["steps"]["redone"]),
    ):
        assert (status[name], fleet[key], page[key], getattr(api, key)) == (str(n), n, n, str(n)), (
            name,
            seen,
        )
    # GPU-seconds: every job of the run, as sacct bills them (Start..End x GPUs).
    by_job = attempts_from(accounting(jobs))
    tries = [a for j in jobs for a in by_job[j] if a.start and a.end]
    wall_s, billed = sum(a.end - a.start for a in tries), sum((a.end - a.start) * a.gpus for a in tries)
    assert wall_s > 0 and abs(g["allocated_s"] - wall_s) <= 0.02 * wall_s, (g["allocated_s"], wall_s)
    gpu_s = g["allocated_gpu_s"]
    if any(a.gpus for a in tries):
        assert billed > 0 and abs(gpu_s - billed) <= 0.02 * billed, (gpu_s, billed)
    else:  # a CPU-only program (Hydra's gpus_per_node=0): no GPU-hours, none made up
        assert gpu_s == 0, g
    assert fleet["gpu_hours"] * 3600 == pytest.approx(gpu_s, rel=1e-6)
    assert page["gpu_hours"] * 3600 == pytest.approx(gpu_s, rel=1e-6)
    assert api.summary.gpu_s == pytest.approx(gpu_s, rel=1e-6)
    assert float(status["GPU-H"]) == pytest.approx(gpu_s / 3600, abs=6e-4)
    print(
        f"\nviews agree on {run_dir.name} ({status.get('PROGRAM', '-')}): {state} at step {step}, "
        f"restarts {g['restarts']}, faults {g['failures']}, redone {g['steps']['redone']}, "
        f"{g['allocated_s']:.0f} s / {gpu_s:.0f} GPU-s (sacct {wall_s:.0f} s / {billed:.0f} GPU-s), jobs {jobs}"
    )
    return {"status": status, "fleet": fleet, "goodput": g}
