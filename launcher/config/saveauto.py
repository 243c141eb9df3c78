"""``storage.save_every_steps=auto``: the contract between the launcher,
which picks the first interval at submission (launcher/plan/forecast.py:
plan_save_interval), and the trainer, which re-tunes it from each save's
measured blocking time (train/checkpoint/autointerval.py).

The interval minimises expected lost time (Young 1974, Daly 2006): about
sqrt(2 x blocking save cost x MTBF) seconds of training between saves, in
steps of the step time; the trainer keeps it within
[max(1, initial // 4), min(train.steps, 4 x initial)] so one odd save
cannot swing it far from the submitted figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

AUTO = "auto"
# How far the trainer may move the interval from the launcher's figure.
RETUNE_FACTOR = 4


@dataclass
class SaveAuto:
    """The launcher's first interval and its inputs (plan.json's ``save_auto``)."""

    steps: int  # the interval the run starts with
    min_steps: int  # the trainer's bounds when it re-tunes
    max_steps: int
    save_cost_s: float  # blocking seconds of one save (predicted)
    step_s: float  # seconds of one training step (predicted)
    mtbf_s: float  # mean seconds between failures of this job (inf: none expected)
    mtbf_source: str  # what the failure rate rests on (history, prior)


def steps_value(value: Any) -> int | None:
    """The configured interval in steps; None for ``auto``. ValueError when
    the value is neither (validate.py turns it into a user error)."""
    if value == AUTO:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"storage.save_every_steps={value!r}: must be an integer >= 1, or {AUTO!r}")
    return value


def interval_s(save_cost_s: float, mtbf_s: float) -> float:
    """sqrt(2 x save cost x MTBF): inf when the job never fails, 0 when saves are free."""
    if not math.isfinite(mtbf_s):
        return math.inf
    return math.sqrt(2.0 * max(0.0, save_cost_s) * max(0.0, mtbf_s))


def interval_steps(save_cost_s: float, mtbf_s: float, step_s: float, lo: int, hi: int) -> int:
    """Young/Daly's interval in whole steps, clamped to [lo, hi]."""
    seconds = interval_s(save_cost_s, mtbf_s)
    if step_s <= 0 or not math.isfinite(seconds):
        return hi
    return max(lo, min(hi, round(seconds / step_s)))


def bounds(initial: int, total_steps: int) -> tuple[int, int]:
    """The trainer's re-tuning range around the launcher's interval."""
    return max(1, initial // RETUNE_FACTOR), max(1, min(total_steps, initial * RETUNE_FACTOR))
