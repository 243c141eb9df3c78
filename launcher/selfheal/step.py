"""One srun of the training step as the supervisor (launcher/selfheal/supervisor.py)
starts it: its record (:class:`Attempt`, shared with the restart, straggler
and grow-back parts), its command line and environment
(:class:`StepLauncher`, also used for grow back's burn-in steps), and its
ranks' heartbeats."""

from __future__ import annotations

import os
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.config.health import ATTEMPT_ENV, read_heartbeats
from launcher.config.scriptjob import tasks_per_node
from launcher.config.secrets import without_secrets
from launcher.config.spec import PLAN_FILE_ENV
from launcher.selfheal.state import SupervisorState
from launcher.selfheal.straggler import StragglerWatch
from launcher.slurm.nodestate import node_info

PORT_BASE, PORT_SPAN = 20000, 20000  # launcher.slurm.render


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
    # Set by a line the supervisor acts on at once (srun's word of a task's
    # death, the store host's missing rank): its poll wakes for it.
    wake: threading.Event = field(default_factory=threading.Event)


def attempt_heartbeats(run_dir: str, tag: str) -> dict[int, dict[str, Any]]:
    """rank -> its last heartbeat, of attempt ``tag``'s ranks only."""
    return {r: h for r, h in read_heartbeats(run_dir).items() if h.get("attempt") == tag}


def task_env() -> dict[str, str]:
    """The tasks' environment: the batch's, with its own PYTHONPATH back (the
    supervisor's is the host code dir; in a container the tasks need theirs),
    less any credential (srun would store it in the step; docs/security.md)."""
    env = without_secrets(os.environ)
    if "MESHRUN_TASK_PYTHONPATH" in env:
        env["PYTHONPATH"] = env.pop("MESHRUN_TASK_PYTHONPATH")
    return env


class StepLauncher:
    """The supervised srun line (``srun FLAGS... PY -u -m MODULE RUN_DIR``)
    placed on chosen nodes, with each attempt's environment."""

    def __init__(self, state: SupervisorState, srun: list[str]) -> None:
        self.state = state
        self.srun = srun
        cfg, plan = state.cfg, state.spec.plan
        # Tasks per node (job.launch=torchrun: one, forking the node's ranks).
        self.rpn = tasks_per_node(cfg.job.kind, cfg.job.launch, plan.ranks_per_node)

    def command(self, nodes: list[str]) -> list[str]:
        assert self.srun and Path(self.srun[0]).name == "srun", self.srun
        return [
            self.srun[0],
            f"--nodes={len(nodes)}",
            f"--ntasks={len(nodes) * self.rpn}",
            f"--ntasks-per-node={self.rpn}",
            f"--nodelist={','.join(nodes)}",
            *self.srun[1:],
        ]

    def env(self, nodes: list[str], n: int, tag: str) -> dict[str, str]:
        """Attempt ``n`` (``tag``) on ``nodes``: its tag, the current plan's
        file, a rendezvous on the first node."""
        env = task_env()
        env[ATTEMPT_ENV] = tag
        env.pop(PLAN_FILE_ENV, None)
        env.update(self.state.plan_env)  # a shrunk layout's plan file
        addr = node_info(nodes[0]).get("NodeAddr") or nodes[0]
        env["MASTER_ADDR"] = addr
        if not self.state.cfg.launcher.master_port and env.get("MASTER_PORT", "").isdigit():
            # A fresh rendezvous port per attempt: the last one's may linger.
            port = int(env["MASTER_PORT"])
            env["MASTER_PORT"] = str(PORT_BASE + (port - PORT_BASE + 7919 * n) % PORT_SPAN)
        return env
