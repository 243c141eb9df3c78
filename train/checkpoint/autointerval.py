"""storage.save_every_steps=auto in the trainer: start from the launcher's
Young/Daly interval (plan.json's ``save_auto``: the predicted save cost, the
MTBF of this runs root's history or the published prior), then after each
save re-tune it from the loop's measured stall and the measured step time,
within the plan's bounds (launcher/config/saveauto.py). Every rank must
save at the same steps: the caller agrees the measurements first (the
slowest rank's figures, :meth:`SavePath.retune`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from launcher.config.saveauto import SaveAuto, interval_s, interval_steps, steps_value

# Step times averaged for the interval (the newest logging steps'), and
# saves (one odd save, e.g. the first's buffer allocation, moves it less).
STEP_WINDOW = 20
SAVE_WINDOW = 5


@dataclass
class AutoInterval:
    chosen: SaveAuto
    steps: int
    step_times: list[float]
    save_costs: list[float] = field(default_factory=list)  # agreed, newest last
    pending: bool = False  # a save since the last re-tune

    @classmethod
    def from_spec(cls, spec: Any) -> AutoInterval | None:
        """None for a fixed interval; ValueError for auto without the plan's figures."""
        if steps_value(spec.cfg.storage.save_every_steps) is not None:
            return None
        chosen = spec.plan.save_auto
        if chosen is None:
            raise ValueError(
                "storage.save_every_steps=auto but the run's plan has no save_auto (a plan.json not "
                "written by this meshrun's launcher): re-create the run with `python -m launcher`"
            )
        return cls(chosen, chosen.steps, [])

    def observe_step(self, step_s: float) -> None:
        """A logging step's measured seconds per step."""
        if step_s > 0:
            self.step_times = [*self.step_times[-(STEP_WINDOW - 1) :], step_s]

    @property
    def step_s(self) -> float:
        """Measured seconds per step (the plan's prediction before any)."""
        return sum(self.step_times) / len(self.step_times) if self.step_times else self.chosen.step_s

    def retune(self, last_save_s: float, step_s: float) -> dict[str, Any]:
        """The new interval from an (agreed) measured save and step time, at
        the mean of the newest saves' costs; the run log's record of it."""
        c = self.chosen
        before, self.pending = self.steps, False
        self.save_costs = [*self.save_costs[-(SAVE_WINDOW - 1) :], last_save_s]
        cost = sum(self.save_costs) / len(self.save_costs)
        self.steps = interval_steps(cost, c.mtbf_s, step_s, c.min_steps, c.max_steps)
        return {**self.record(before, cost, step_s, "measured"), "last_save_s": last_save_s}

    def record(self, before: int, save_cost_s: float, step_s: float, basis: str) -> dict[str, Any]:
        c = self.chosen
        return {
            "steps": self.steps,
            "previous_steps": before,
            "basis": basis,  # predicted (the launcher's) or measured (a save's)
            "save_cost_s": save_cost_s,  # measured: the mean of the newest SAVE_WINDOW saves
            "step_s": step_s,
            "mtbf_s": c.mtbf_s if c.mtbf_s != float("inf") else None,
            "mtbf_source": c.mtbf_source,
            "young_daly_s": interval_s(save_cost_s, c.mtbf_s),
            "min_steps": c.min_steps,
            "max_steps": c.max_steps,
        }
