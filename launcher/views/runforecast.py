"""``meshrun status`` and the fleet: when a run will finish, P50 and P90,
and what it will cost, counting the failures still to come.

From the run's own files: steps done and the measured step time
(metrics.jsonl: the newest step records' trimmed mean, each start's first left
out), the time
already run (goodput.json's allocated wall seconds, else metrics.jsonl's span),
the save interval in force (the newest save_interval event, else the
config) and a save's measured stall (checkpoint events); the restart cost
measured from this run's resumes (faults.jsonl's seconds from a fault to
the first resumed step) else the prior (launcher/plan/forecast.py); the
failure rate of the runs root's history or the published prior at the
run's GPU count (launcher/perf/reliability.py). The Monte Carlo of
:func:`launcher.perf.reliability.forecast` adds restarts and the work since
the last save (half an interval on average) per failure. A finished run's
forecast is its actual time. Unreadable lines are skipped and counted in
``note``, never fatal.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.config.runfiles import FAULTS_FILE, GOODPUT_FILE, METRICS_FILE
from launcher.config.saveauto import steps_value
from launcher.config.spec import SpecError, load_spec
from launcher.perf.reliability import HISTORY_MAX_RUNS, failure_rate, forecast
from launcher.plan.forecast import PRIOR_RESTART_S
from launcher.views.goodputtimeline import IN_PROCESS_RESUME

# metrics.jsonl lines read from the end (step time, interval, saves).
TAIL_LINES = 400


@dataclass
class RunForecast:
    elapsed_h: float  # already run
    p50_h: float  # total: already run + remaining, median
    p90_h: float
    p50_usd: float | None  # None: no price (CPU, cluster=local)
    p90_usd: float | None
    steps_done: int
    steps_total: int
    step_s: float
    interval_steps: int
    mtbf_h: float
    rate_source: str
    restart_s: float
    restart_basis: str  # "measured (N resume(s))" or "prior"
    expected_failures: float
    finished: bool
    note: str = ""  # skipped records, said

    def span(self) -> str:
        """P50 / P90, short (the fleet's column)."""
        return f"{_dur(self.p50_h)} / {_dur(self.p90_h)}"

    def line(self) -> str:
        """One line for ``meshrun status``."""
        usd = (
            f", ${self.p50_usd:,.0f} / ${self.p90_usd:,.0f}"
            if self.p50_usd is not None and self.p90_usd is not None
            else ""
        )
        if self.finished:
            return f"finished in {_dur(self.elapsed_h)}{usd}"
        mtbf = f"{self.mtbf_h:.3g} h" if math.isfinite(self.mtbf_h) else "none expected"
        return (
            f"finish P50 {_dur(self.p50_h)} / P90 {_dur(self.p90_h)}{usd} "
            f"({_dur(self.elapsed_h)} run, step {self.steps_done}/{self.steps_total} at {self.step_s:.3g} s; "
            f"{self.expected_failures:.2g} failure(s) expected, MTBF {mtbf} from the {self.rate_source}; "
            f"restart {self.restart_s:.0f} s {self.restart_basis}; saves every {self.interval_steps} steps)"
            + (f"; {self.note}" if self.note else "")
        )


def _dur(hours: float) -> str:
    return f"{hours:.3g} h" if hours >= 1 else f"{60 * hours:.3g} min"


def _tail(run_dir: Path) -> tuple[list[dict], int]:
    try:
        lines = (run_dir / METRICS_FILE).read_text().splitlines()[-TAIL_LINES:]
    except OSError:
        return [], 0
    out, bad = [], 0
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out, bad


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else None


def _resumes(path: Path) -> tuple[list[float], int]:
    """The seconds from a fault to the first resumed step, per resume in a
    faults.jsonl, and its unreadable records."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return [], 0
    lost, bad = [], 0
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(rec, dict) and rec.get("event") == "resumed":
            s = _num(rec.get("seconds_lost"))
            if s is None:
                bad += 1
            else:
                lost.append(s)
    return lost, bad


def _restart(run_dir: Path, runs_root: str | Path | None = None) -> tuple[float, str, int]:
    """(restart seconds, basis, unreadable records): this run's resumes, else
    the other runs' under the runs root (this cluster's), else the prior."""
    lost, bad = _resumes(run_dir / FAULTS_FILE)
    if lost:
        return sum(lost) / len(lost), f"(measured, {len(lost)} resume(s))", bad
    root = Path(runs_root) if runs_root else None
    if root is not None and root.is_dir():
        mine = (run_dir / FAULTS_FILE).resolve()
        files = sorted(root.glob(f"**/{FAULTS_FILE}"), key=_mtime, reverse=True)[:HISTORY_MAX_RUNS]
        for f in files:
            if f.resolve() != mine:
                more, _ = _resumes(f)  # the history's torn lines: failure_rate says them
                lost += more
        if lost:
            return sum(lost) / len(lost), f"(measured under the runs root, {len(lost)} resume(s))", bad
    return PRIOR_RESTART_S, "(prior)", bad


def restart_cost_s(run_dir: str | Path, runs_root: str | Path | None = None) -> tuple[float, str]:
    """(seconds a restart costs, its basis): this run's resumes, else the
    runs root's (this cluster's), else the prior."""
    s, basis, _ = _restart(Path(run_dir), runs_root)
    return s, basis


def _steps(recs: list[dict]) -> list[dict]:
    return [r for r in recs if "event" not in r and _num(r.get("step")) is not None]


# Step times the forecast averages: the newest, a start's first left out.
STEP_WINDOW = 50
# Events that begin a new start in metrics.jsonl (an in-process recovery's too: its first step rebuilds).
STARTS = ("resume", "shrunk_layout", IN_PROCESS_RESUME)


def _step_s(recs: list[dict]) -> float | None:
    """A step's typical seconds: the mean of the middle 80% of the newest
    ``STEP_WINDOW`` step times, each start's first step left out (compile,
    warm-up: right after a resume the newest steps are a new start's, and a
    plain mean of them read twice the steady time in the forecast campaign,
    scripts/bench_forecast.py); None before two steps."""
    times, first = [], True
    for r in recs:
        if r.get("event") in STARTS:
            first = True
        elif "event" not in r and _num(r.get("step")) is not None:
            if not first and (t := _num(r.get("step_time_s"))) is not None:
                times.append(t)
            first = False
    times = sorted(times[-STEP_WINDOW:])
    cut = len(times) // 10
    mid = times[cut : len(times) - cut]
    return sum(mid) / len(mid) if mid else None


def measured_step_s(run_dir: str | Path) -> float | None:
    """:func:`_step_s` of metrics.jsonl's newest records."""
    return _step_s(_tail(Path(run_dir))[0])


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0


def _elapsed_s(run_dir: Path, recs: list[dict]) -> float:
    """The allocations' wall seconds so far (goodput.json's, from sacct: spares
    and a start on CPU nodes, with no GPUs in Slurm's TRES, counted right),
    else the step records' span."""
    try:
        g = json.loads((run_dir / GOODPUT_FILE).read_text())
        s = _num(g.get("allocated_s"))
        if s:
            return s
    except (OSError, ValueError, AttributeError):
        pass
    times = [t for r in recs if (t := _num(r.get("time"))) is not None]
    return max(times) - min(times) if len(times) > 1 else 0.0


def _total(cfg: Any, last: dict[str, Any]) -> int | None:
    """The run's steps to do: the trainer's train.steps; a script's
    job.total_steps or its progress records' total; None when unknown."""
    if cfg.job.kind != "script":
        return max(1, cfg.train.steps)
    total = int(getattr(cfg.job, "total_steps", 0) or 0) or int(last.get("total") or 0)
    return total or None


def run_forecast(run_dir: str | Path, finished: bool = False, running: bool = False) -> RunForecast | None:
    """None when the run has no spec or no measured step yet, or its steps
    to do are unknown (a script's) while it runs. A ``running`` job is
    never finished, whatever its step."""
    run_dir = Path(run_dir)
    try:
        spec = load_spec(run_dir)
    except (SpecError, OSError, ValueError):
        return None
    cfg, plan = spec.cfg, spec.plan
    recs, bad = _tail(run_dir)
    steps = _steps(recs)
    step_s = _step_s(recs)
    if step_s is None:
        return None
    done, known = int(steps[-1]["step"]), _total(cfg, steps[-1])
    if known is None and (running or not finished):
        return None
    total = known or done
    interval = steps_value(cfg.storage.save_every_steps) or (
        plan.save_auto.steps if plan.save_auto else total
    )
    for r in recs:
        if r.get("event") == "save_interval" and isinstance(r.get("steps"), int):
            interval = r["steps"]
    saves = [s for r in recs if r.get("event") == "checkpoint" and (s := _num(r.get("save_s"))) is not None]
    gpus = max(1, plan.world_size)
    rate = failure_rate(cfg.launcher.runs_root, cfg.cluster.gpu_h_per_failure)
    mtbf_s = rate.mtbf_h(gpus) * 3600.0
    restart_s, basis, bad_faults = _restart(run_dir, cfg.launcher.runs_root)
    elapsed_s = _elapsed_s(run_dir, recs)
    finished = not running and (finished or done >= total)
    f = forecast(
        0.0 if finished else max(0, total - done) * step_s,
        mtbf_s=mtbf_s,
        restart_s=restart_s,
        interval_s=interval * step_s,
        save_cost_s=sum(saves) / len(saves) if saves else 0.0,
    )
    p50_h, p90_h = elapsed_s / 3600.0 + f.p50_h, elapsed_s / 3600.0 + f.p90_h
    usd_h = (
        (cfg.cluster.nodes + cfg.cluster.spare_nodes) * cfg.cluster.price_on_demand_usd_per_node_hour
        if plan.device == "cuda"
        else 0.0
    )
    skipped = bad + bad_faults
    return RunForecast(
        elapsed_h=elapsed_s / 3600.0,
        p50_h=p50_h,
        p90_h=p90_h,
        p50_usd=p50_h * usd_h if usd_h > 0 else None,
        p90_usd=p90_h * usd_h if usd_h > 0 else None,
        steps_done=done,
        steps_total=total,
        step_s=step_s,
        interval_steps=interval,
        mtbf_h=mtbf_s / 3600.0,
        rate_source=rate.source,
        restart_s=restart_s,
        restart_basis=basis,
        expected_failures=f.expected_failures,
        finished=finished,
        note=f"{skipped} unreadable record(s) skipped" if skipped else "",
    )
