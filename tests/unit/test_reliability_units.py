"""Failure rate (history over a published prior), the Young/Daly interval
and the finish forecast (launcher/perf/reliability.py), and the dry run's
risk rows (launcher/plan/forecast.py).

Here: its tests that start no process, no process group and no server
(tier unit); the rest: tests/local/test_reliability.py."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from launcher.perf.reliability import (
    PRIOR_GPU_HOURS_PER_FAILURE,
    failure_rate,
    forecast,
    young_daly_interval_s,
)


def _run(root: Path, name: str, gpu_h: float, faults: int) -> None:
    d = root / name
    d.mkdir(parents=True)
    (d / "goodput.json").write_text(json.dumps({"allocated_gpu_s": gpu_h * 3600}))
    lines = [json.dumps({"cause": "signal", "node": "n1", "action": "restart"}) for _ in range(faults)]
    lines += [json.dumps({"event": "resumed", "seconds_lost": 5})]  # not a fault
    (d / "faults.jsonl").write_text("\n".join(lines) + "\n")


def test_no_history_is_the_published_prior(tmp_path: Path) -> None:
    r = failure_rate(tmp_path)
    assert r.mtbf_h(1024) == pytest.approx(7.9) and r.faults == 0
    assert r.mtbf_h(16384) == pytest.approx(7.9 / 16)
    assert "prior" in r.source and "arXiv 2410.21680" in r.source


def test_history_moves_the_rate_towards_the_clusters_own(tmp_path: Path) -> None:
    # 200 faults in 20,000 GPU-hours: one per 100 GPU-h, 80x the prior's rate.
    _run(tmp_path, "a", 10_000, 150)
    _run(tmp_path, "b", 10_000, 50)
    r = failure_rate(tmp_path)
    assert (r.faults, r.gpu_hours) == (200, pytest.approx(20_000))
    assert r.per_gpu_hour == pytest.approx(201 / (20_000 + PRIOR_GPU_HOURS_PER_FAILURE))
    assert 1 / r.per_gpu_hour < 200  # far nearer the history's 100 GPU-h than the prior's 8,090
    # A CPU run (a local one's goodput.json: 0 GPU-seconds) trained no GPU: its faults are none of theirs.
    _run(tmp_path, "cpu", 0, 30)
    assert (failure_rate(tmp_path).faults, failure_rate(tmp_path).gpu_hours) == (200, pytest.approx(20_000))


def test_a_corrupt_history_is_skipped_and_said(tmp_path: Path) -> None:
    _run(tmp_path, "a", 100, 1)
    (tmp_path / "a" / "faults.jsonl").write_text('{"cause": "signal"}\nnot json\n')
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "goodput.json").write_text("{broken")
    r = failure_rate(tmp_path)
    assert r.faults == 1 and "2 unreadable history record(s) skipped" in r.source


def test_young_daly_interval() -> None:
    assert young_daly_interval_s(2.0, 3600.0) == pytest.approx(math.sqrt(2 * 2 * 3600))
    assert young_daly_interval_s(2.0, math.inf) == math.inf
    assert young_daly_interval_s(0.0, 3600.0) == 0.0


def test_forecast_without_failures_is_the_work_plus_saves() -> None:
    f = forecast(3600.0, mtbf_s=math.inf, restart_s=60, interval_s=600, save_cost_s=10)
    assert f.p50_h == f.p90_h == pytest.approx((3600 + 5 * 10) / 3600)  # 6 chunks, 5 saves
    assert f.expected_failures == 0


def test_forecast_quantiles_bracket_independently_simulated_runs() -> None:
    """Runs replayed with their own random failures (another seed, event by
    event): about half finish by P50 and nine in ten by P90."""
    work, mtbf, restart, every = 10 * 3600.0, 2 * 3600.0, 300.0, 900.0
    f = forecast(work, mtbf_s=mtbf, restart_s=restart, interval_s=every, save_cost_s=0.0, samples=4000)
    assert f.p50_h * 3600 > work and f.p90_h > f.p50_h
    assert f.expected_failures == pytest.approx(5.6, rel=0.15)  # ~work/mtbf, plus the redone time's share
    rng = random.Random(12345)
    finishes = []
    for _ in range(400):
        t, done, next_fail = 0.0, 0.0, rng.expovariate(1 / mtbf)
        while done < work:
            step = min(every, work - done)
            if t + step <= next_fail:
                t, done = t + step, done + step
            else:
                t = next_fail + restart
                next_fail = t + rng.expovariate(1 / mtbf)
        finishes.append(t / 3600)
    under50 = sum(x <= f.p50_h for x in finishes) / len(finishes)
    under90 = sum(x <= f.p90_h for x in finishes) / len(finishes)
    assert 0.42 <= under50 <= 0.58 and 0.85 <= under90 <= 0.95, (under50, under90)


def test_a_sites_own_prior_replaces_metas_and_history_still_adds(tmp_path: Path) -> None:
    from launcher.perf.reliability import prior_gpu_h

    r = failure_rate(tmp_path, gpu_h_per_failure=16.0)
    assert r.mtbf_h(8) == pytest.approx(2.0)
    assert "cluster.gpu_h_per_failure=16 GPU-h" in r.source and "Meta" not in r.source
    assert prior_gpu_h(0.0) == (PRIOR_GPU_HOURS_PER_FAILURE, failure_rate(None).source)
    _run(tmp_path, "a", 16.0, 3)  # 3 faults in 16 GPU-h: the posterior (3 + 1) / (16 + 16)
    assert failure_rate(tmp_path, 16.0).per_gpu_hour == pytest.approx(4 / 32)


def test_status_step_time_leaves_each_starts_first_steps_and_outliers_out(tmp_path: Path) -> None:
    """Right after a resume the newest steps are a new start's: its first
    (compile, warm-up) and a checkpoint step's stall must not set the pace."""
    from launcher.views.runforecast import _elapsed_s, _step_s

    recs = [{"step": s, "step_time_s": 0.1, "time": float(s)} for s in range(1, 31)]
    recs += [{"event": "resume", "step": 20}, {"step": 21, "step_time_s": 5.0, "time": 40.0}]
    recs += [{"step": s, "step_time_s": 0.1, "time": 40.0 + s} for s in range(22, 30)]
    recs += [{"step": 30, "step_time_s": 3.0, "time": 80.0}]  # a save's stall
    assert _step_s(recs) == pytest.approx(0.1)
    assert _step_s(recs[:1]) is None
    # Already run: goodput.json's wall seconds, not its GPU-seconds over the
    # training ranks (spares held, or CPU nodes with no GPUs in Slurm's TRES).
    (tmp_path / "goodput.json").write_text(json.dumps({"allocated_s": 120.0, "allocated_gpu_s": 0.0}))
    assert _elapsed_s(tmp_path, recs) == 120.0
    (tmp_path / "goodput.json").write_text(json.dumps({"allocated_s": 120.0, "allocated_gpu_s": 3840.0}))
    assert _elapsed_s(tmp_path, recs) == 120.0


def test_history_counts_the_gpu_hours_that_trained_not_the_spares(tmp_path: Path) -> None:
    """A job's faults come from the GPUs it trains on: a spare waiting (the
    degraded bucket) adds no exposure, or the rate reads 4x low on 1 node + 3 spares."""
    d = tmp_path / "r"
    d.mkdir()
    doc = {"allocated_gpu_s": 8 * 3600.0, "buckets_gpu_s": {"productive": 1800.0, "degraded": 6 * 3600.0}}
    (d / "goodput.json").write_text(json.dumps(doc))
    (d / "faults.jsonl").write_text(json.dumps({"cause": "signal", "node": "n1"}) + "\n")
    r = failure_rate(tmp_path, gpu_h_per_failure=2.0)
    assert r.gpu_hours == pytest.approx(2.0) and r.per_gpu_hour == pytest.approx(2 / 4.0)


def test_recovery_costs_scale_from_the_measured_figures() -> None:
    """launcher/perf/recoverycost.py: at the measured size a full restart is
    the measured 12.0 s plus the checkpoint read; it grows by the stated
    term per doubling of the ranks; in-process recovery is NVRx's 0.5 s at
    16k ranks plus detection, with no checkpoint read; a save scales with
    the shard."""
    from launcher.perf import recoverycost as rc

    small = rc.restart_today(rc.MEASURED_RANKS, 0.0, 2)
    assert small.restart_s == pytest.approx(rc.RESUMED_S) and small.redo_since_checkpoint
    big = rc.restart_today(16384, 0.0, 8)
    assert big.restart_s == pytest.approx(rc.RESUMED_S + 12 * rc.RDZV_S_PER_DOUBLING)
    state = 405e9 * rc.STATE_BYTES_PER_PARAM
    assert rc.restart_today(16384, state, 8).restart_s - big.restart_s == pytest.approx(
        rc.checkpoint_read_s(state, 2048)
    )
    inproc = rc.restart_inprocess(16384)  # 16,384 x 8 store ops at 36,000/s: 3.64 s of rendezvous
    assert inproc.restart_s == pytest.approx(rc.DETECT_S + 16384 * 8 / 36000 + rc.INPROC_REBUILD_S)
    assert inproc.redo_steps == 1 and not inproc.redo_since_checkpoint
    assert rc.restart_inprocess(1024).restart_s < inproc.restart_s < rc.restart_today(16384, 0.0, 8).restart_s
    assert rc.save_cost_s(rc.SAVE_BYTES * 4, 4) == pytest.approx(rc.SAVE_S)
