"""What the supervisor's parts share (launcher/selfheal/supervisor.py): one
explicit record of the run's mutable state, handed to each part that reads
or changes it (restarts, stragglers, grow back, the step launcher), so that
who changes what is visible at the call, not hidden in a mixin's ``self``."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.config import nodeledger, nodename
from launcher.config.health import read_faults
from launcher.config.plandata import Plan
from launcher.config.schema import RunConfig
from launcher.config.spec import RunSpec, load_spec
from launcher.slurm.nodestate import hostnames


@dataclass
class SupervisorState:
    """The run as the supervisor holds it between and during attempts."""

    run_dir: str
    spec: RunSpec
    ledger: Path  # the runs root's bad-node ledger
    job: str = ""  # SLURM_JOB_ID ("" outside Slurm)
    slurm_restart: str = "0"  # SLURM_RESTART_COUNT: the first part of every attempt's tag
    alloc: list[str] = field(default_factory=list)  # the job's nodes at its start
    excluded: dict[str, str] = field(default_factory=dict)  # node -> why it is left out
    earlier: list[dict[str, Any]] = field(default_factory=list)  # faults.jsonl, appended as we go
    restarts_left: int = 0
    requeue_why: str = ""  # set when the forecast chose a requeue over a shrink (main() requeues)
    stopping: int | None = None  # the stop signal this process got (scancel, preemption)
    plan: Plan = field(init=False)  # the layout of the current attempt
    plan_env: dict[str, str] = field(
        default_factory=dict
    )  # what the tasks get to run it ($MESHRUN_PLAN_FILE)

    def __post_init__(self) -> None:
        self.plan = self.spec.plan

    @property
    def cfg(self) -> RunConfig:
        return self.spec.cfg

    @classmethod
    def from_env(cls, run_dir: str) -> SupervisorState:
        """The state at the batch script's start: the spec, Slurm's job
        variables, and what faults.jsonl already says of this job."""
        spec = load_spec(run_dir)
        job = os.environ.get("SLURM_JOB_ID", "")
        slurm_restart = os.environ.get("SLURM_RESTART_COUNT", "0") or "0"
        earlier = read_faults(run_dir)
        # node -> why; nodes this start's preflight failed (launcher/nodecheck/nodepreflight.py --record) first.
        pre = f"{slurm_restart}.preflight"
        excluded = {
            f["node"]: "preflight"
            for f in earlier
            if (f.get("job"), f.get("attempt")) == (job, pre) and nodename.is_node_name(f.get("node"))
        }
        failure_requeues = int(os.environ.get("MESHRUN_FAILURE_RESTARTS", "0") or 0)
        # In-allocation restarts of this job before a requeue count as well.
        used = sum(1 for f in earlier if f.get("job") == job and f.get("action") == "restart")
        return cls(
            run_dir=run_dir,
            spec=spec,
            ledger=nodeledger.ledger_path(spec.cfg),
            job=job,
            slurm_restart=slurm_restart,
            alloc=hostnames(os.environ.get("SLURM_JOB_NODELIST", "")),
            excluded=excluded,
            earlier=earlier,
            restarts_left=spec.cfg.launcher.max_restarts - failure_requeues - used,
        )
