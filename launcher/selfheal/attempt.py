"""One srun of the training step, as the supervisor (launcher/selfheal/supervisor.py)
and its policies (restart, stragglers, grow back) see it."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from typing import Any

from launcher.selfheal.straggler import StragglerWatch


@dataclass
class Attempt:
    """One srun of the training step."""

    tag: str
    nodes: list[str]
    started: float
    proc: subprocess.Popen[str] | None = None
    srun_errors: list[tuple[float, str]] = field(default_factory=list)
    hang: dict[str, Any] | None = None
    forwarded: bool = False  # a stop signal the supervisor got was passed to this srun
    replace: dict[str, Any] | None = None  # a straggler's fault: its node is swapped for a spare
    grow: dict[str, Any] | None = None  # a left-out node passed its burn-ins: back to the planned layout
    stragglers: StragglerWatch | None = None
