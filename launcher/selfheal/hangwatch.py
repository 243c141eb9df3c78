"""Hang limits of the batch-level supervisor (launcher/selfheal/supervisor.py):
which ranks have not advanced their heartbeat for too long.

The step limit (``launcher.hang_timeout_s``; an explicit value always wins)
defaults to :data:`HANG_STEP_FACTOR` x the step time, at least
:data:`HANG_FLOOR_S`. The step time is the MEASURED one once the run has
shown :data:`MIN_MEASURED` step intervals in its heartbeats: the median of
the last :data:`MEASURED_STEPS` per-step intervals (a rank's beat at step
``s`` then at step ``s + k``, ``k >= 1``, in the same attempt, gives
``dt / k``); before that, the plan's PREDICTED one (tokens per step over the
priced throughput). Start-up, restore and save have their own limit
(``launcher.hang_startup_timeout_s``, 0: :data:`STARTUP_TIMEOUT_S`).

The supervisor polls the heartbeats about once a second, so a step faster
than that is measured over several steps (``dt / k``); the median keeps a
save or an evaluation between two beats from moving the limit.
Standard library only.
"""

from __future__ import annotations

import json
import statistics
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from launcher.config.runfiles import RESULT_FILE
from launcher.config.spec import RunSpec

# Defaults of the hang limits (launcher.hang_timeout_s / hang_startup_timeout_s = 0).
HANG_FLOOR_S = 120.0
HANG_STEP_FACTOR = 20.0
STARTUP_TIMEOUT_S = 900.0
MEASURED_STEPS = 20  # the median over this many of the newest per-step intervals
MIN_MEASURED = 3  # intervals needed before the measured step time replaces the predicted one


def predicted_step_s(spec: RunSpec) -> float:
    """The plan's predicted seconds per step (0 when the plan has no price)."""
    plan = spec.plan
    if plan.cost is None or plan.cost.tokens_per_s_per_gpu <= 0:
        return 0.0
    return plan.tokens_per_step / (plan.cost.tokens_per_s_per_gpu * plan.world_size)


def step_limit(spec: RunSpec, measured_s: float | None = None) -> float:
    """The step limit: ``launcher.hang_timeout_s`` when set, else the factor
    times the measured step time (when known) or the predicted one, floored."""
    if spec.cfg.launcher.hang_timeout_s:
        return float(spec.cfg.launcher.hang_timeout_s)
    step_s = measured_s if measured_s is not None else predicted_step_s(spec)
    return max(HANG_FLOOR_S, HANG_STEP_FACTOR * step_s)


def hang_limits(spec: RunSpec, measured_s: float | None = None) -> tuple[float, float]:
    """(step limit, start-up/restore/save limit) in seconds."""
    return step_limit(spec, measured_s), spec.cfg.launcher.hang_startup_timeout_s or STARTUP_TIMEOUT_S


class StepClock:
    """The measured step time, from the step heartbeats the supervisor sees."""

    def __init__(self, keep: int = MEASURED_STEPS, need: int = MIN_MEASURED) -> None:
        self.intervals: deque[float] = deque(maxlen=keep)
        self.need = need
        self._last: dict[int, tuple[str, int, float]] = {}  # rank -> (attempt, step, time)

    def observe(self, hbs: dict[int, dict[str, Any]]) -> None:
        """Take in the ranks' current heartbeats (rank -> heartbeat)."""
        for rank, h in sorted(hbs.items()):
            if h.get("phase") != "step":
                continue
            now = (str(h.get("attempt", "")), int(h["step"]), float(h["time"]))
            last = self._last.get(rank)
            self._last[rank] = now
            if last is None or last[0] != now[0] or now[1] <= last[1] or now[2] <= last[2]:
                continue  # first sight, a new attempt, or no new step
            if rank == min(hbs):  # one rank's clock: the ranks step together
                self.intervals.append((now[2] - last[2]) / (now[1] - last[1]))

    def step_s(self) -> float | None:
        """The median of the newest intervals; None until ``need`` were seen."""
        if len(self.intervals) < self.need:
            return None
        return statistics.median(self.intervals)


class HangWatch:
    """The limits of one supervised run and the ranks past them."""

    def __init__(self, spec: RunSpec, say: Callable[[str], None]) -> None:
        self.spec = spec
        self.world = spec.plan.world_size
        self.clock = StepClock()
        self.say = say
        self.step_limit, self.startup_limit = hang_limits(spec)
        self.measured = False

    def describe(self) -> str:
        how = (
            "measured" if self.measured else ("set" if self.spec.cfg.launcher.hang_timeout_s else "predicted")
        )
        return f"steps {self.step_limit:.0f} s ({how}), start-up/restore/save {self.startup_limit:.0f} s"

    def _update(self, hbs: dict[int, dict[str, Any]]) -> None:
        self.clock.observe(hbs)
        step_s = self.clock.step_s()
        if step_s is None or self.spec.cfg.launcher.hang_timeout_s:
            return
        limit = step_limit(self.spec, step_s)
        if not self.measured or abs(limit - self.step_limit) > 0.25 * self.step_limit:
            self.say(
                f"hang limit for steps: {limit:.0f} s (measured step {step_s:.3g} s x {HANG_STEP_FACTOR:g}, "
                f"at least {HANG_FLOOR_S:.0f} s; was {self.step_limit:.0f} s)"
            )
        self.step_limit, self.measured = limit, True

    def stale(self, hbs: dict[int, dict[str, Any]], started: float, now: float) -> dict[int, dict[str, Any]]:
        """Ranks past their phase's limit: rank -> {phase, step, silent_s,
        last_beat_at, limit_s, node}. ``hbs``: this attempt's heartbeats;
        ``started``: when the attempt started (a rank with no beat yet)."""
        self._update(hbs)
        # A team's program (job=script) most often prints its progress on
        # rank 0 only (Lightning's bar, the HF Trainer's): a rank that has
        # reported no step follows the ranks that do. Its collectives tie
        # them, so a stalled quiet rank stalls them, and the stack signal
        # then finds it (it does not answer).
        script = self.spec.cfg.job.kind == "script"
        follow = script and any(h.get("phase") in ("warmup", "step") for h in hbs.values())
        # ... and, once they have ended, has the step limit from their end to
        # end too (its last work, its teardown: no collective is left).
        # Only when rank 0's program completed: ranks stopped by srun or a
        # requeue also say "done", and a killed quiet rank's beat is old.
        ended = 0.0
        if script and hbs.get(0, {}).get("phase") == "done" and completed_since(self.spec.run_dir, started):
            ended = max(float(h["time"]) for h in hbs.values() if h.get("phase") == "done")
        out = {}
        for r in range(self.world):
            h = hbs.get(r)
            last = float(h["time"]) if h else started
            phase = h["phase"] if h else "startup"
            if phase == "done" or (follow and h is not None and phase == "startup"):
                continue  # a rank that has ended is not hung (its peers may be)
            limit = self.step_limit if phase == "step" else self.startup_limit
            if script and phase == "startup" and ended > last:
                # Teardown is no longer than a step, from their end or from
                # its own newest output or write (a rank still saving works).
                last, limit = max(ended, float(h.get("active") or 0) if h else 0.0), self.step_limit
            if now - last > limit:
                out[r] = {
                    "phase": phase,
                    "step": int(h["step"]) if h else 0,
                    "silent_s": round(now - last, 1),
                    "last_beat_at": last,
                    "limit_s": limit,
                    "node": h.get("node") if h else None,
                }
        return {} if ended and self.teardown_busy(hbs, out) else out

    @staticmethod
    def teardown_busy(hbs: dict[int, dict[str, Any]], stale: dict[int, dict[str, Any]]) -> bool:
        """Rank 0's program completed, every rank past its limit is a quiet
        one in teardown, and another quiet rank is still within it (still
        writing): wait. Ending the step would end that rank with them, and
        what it was writing."""
        quiet = {r for r, h in hbs.items() if h.get("phase") == "startup"}
        return bool(stale) and set(stale) <= quiet and bool(quiet - set(stale))


def completed_since(run_dir: str, started: float) -> dict[str, Any]:
    """result.json when rank 0's wrapper wrote "completed" since ``started``, else {}."""
    try:
        path = Path(run_dir) / RESULT_FILE
        result = json.loads(path.read_text()) if path.stat().st_mtime >= started else {}
    except (OSError, ValueError):
        return {}
    return result if isinstance(result, dict) and result.get("status") == "completed" else {}
