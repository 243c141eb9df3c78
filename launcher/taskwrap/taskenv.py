"""The program's side of a ``job=script`` task: who it is (torchrun's
variables from Slurm's), its environment, its argv and cwd, and how long it
gets to stop. Pure mapping from the task's environment and the run's spec
(launcher/taskwrap/wrapper.py starts and watches the program).

Standard library only, as the wrapper."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from launcher.config.plandata import stop_margin_s
from launcher.config.scriptjob import (
    CHECKPOINT_DIR,
    CHECKPOINT_DIR_ENV,
    PROGRESS_DIR,
    PROGRESS_FILE_ENV,
    PROJECT_DIR_ENV,
    REQUEUE_ASKED,
    REQUEUE_ASKED_ENV,
    RUN_DIR_ENV,
    STOPPING_ENV,
    progress_path,
    resume_argv,
    stopping_path,
)
from launcher.config.spec import LAUNCHER_PID_ENV, RunSpec
from launcher.slurm.render import CODE_DIR, PORT_BASE, PORT_SPAN
from launcher.taskwrap.workcopy import missing_entry, run_workdir

SHIM_DIR = Path(__file__).resolve().parent / "bin"  # meshrun's scontrol
# Its sitecustomize.py: faulthandler on the stack signal (a hang's stacks).
STACK_HOOK_DIR = Path(__file__).resolve().parent / "stackhook"
REAL_SCONTROL_ENV = "MESHRUN_REAL_SCONTROL"
DEFAULT_KILL_WAIT_S = 30.0  # Slurm's default KillWait (train.loop.signals)


@dataclass
class Ranks:
    """Who this task is; ``reports``: the ranks whose heartbeats it writes
    (one, or a node's under torchrun)."""

    rank: int
    local_rank: int
    world: int
    local_world: int
    node: int
    reports: list[int] = field(default_factory=list)


def _int(env: dict[str, str], *keys: str, default: int) -> int:
    for k in keys:
        v = env.get(k, "")
        if v.isdigit():
            return int(v)
    return default


def _tasks_on_node(env: dict[str, str], default: int) -> int:
    # "2(x3),1": the first node's count (meshrun asks for the same on every node).
    spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or ""
    head = spec.split(",", 1)[0].split("(", 1)[0]
    return int(head) if head.isdigit() else default


def task_ranks(env: dict[str, str], spec: RunSpec) -> Ranks:
    """This task's place: torchrun-style variables when set (local runs),
    else Slurm's; under torchrun, this node's share of the world."""
    plan = spec.plan
    if spec.cfg.job.launch == "torchrun":
        node = _int(env, "GROUP_RANK", "SLURM_NODEID", default=0)
        rpn = plan.ranks_per_node
        first = node * rpn
        return Ranks(first, 0, plan.world_size, rpn, node, list(range(first, first + rpn)))
    if "RANK" in env and "WORLD_SIZE" in env:
        rank, world = _int(env, "RANK", default=0), _int(env, "WORLD_SIZE", default=1)
        local_world = _int(env, "LOCAL_WORLD_SIZE", default=plan.ranks_per_node)
        local = _int(env, "LOCAL_RANK", default=rank % local_world)
        node = _int(env, "GROUP_RANK", default=rank // local_world)
    else:
        rank, world = _int(env, "SLURM_PROCID", default=0), _int(env, "SLURM_NTASKS", default=1)
        local = _int(env, "SLURM_LOCALID", default=0)
        local_world = _tasks_on_node(env, plan.ranks_per_node)
        node = _int(env, "SLURM_NODEID", default=rank // max(local_world, 1))
    return Ranks(rank, local, world, local_world, node, [rank])


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list (``scontrol show hostnames``; a
    plain name when scontrol is not there)."""
    if not nodelist:
        return ""
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.split()
        return out[0] if out else ""
    except (OSError, subprocess.SubprocessError):
        return nodelist.split(",", 1)[0] if "[" not in nodelist else ""


def rendezvous(env: dict[str, str]) -> tuple[str, str]:
    """MASTER_ADDR / MASTER_PORT: what the batch script and the supervisor
    exported (the first node's NodeAddr, a port per job and attempt) as the
    trainer uses them; else the step's first node and the job's port."""
    addr = env.get("MASTER_ADDR") or first_host(
        env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "")
    )
    port = env.get("MASTER_PORT", "")
    if not port.isdigit():
        job = _int(env, "SLURM_JOB_ID", default=-1)
        port = str(PORT_BASE + job % PORT_SPAN) if job >= 0 else "29500"
    return addr or "127.0.0.1", port


def _python_path(value: str) -> str:
    """The task's PYTHONPATH less meshrun's code dir: a program's own
    ``train`` or ``launcher`` package must not be shadowed by meshrun's."""
    keep = [p for p in value.split(os.pathsep) if p and os.path.realpath(p) != os.path.realpath(CODE_DIR)]
    return os.pathsep.join(keep)


def program_env(env: dict[str, str], spec: RunSpec, me: Ranks) -> dict[str, str]:
    """The program's environment: the task's, torchrun's variables, meshrun's."""
    out = dict(env)
    # The batch script's choice for meshrun's `python -m` (its code dir first);
    # a program run with -m from its project dir needs the cwd on sys.path.
    out.pop("PYTHONSAFEPATH", None)
    out.pop(LAUNCHER_PID_ENV, None)
    # The stack hook first: its sitecustomize imports the one it shadows.
    out["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(STACK_HOOK_DIR), _python_path(out.get("PYTHONPATH", ""))) if p
    )
    addr, port = rendezvous(env)
    out.update({"MASTER_ADDR": addr, "MASTER_PORT": port, "PYTHONUNBUFFERED": "1"})
    if spec.cfg.job.launch == "tasks":
        out.update(
            {
                "RANK": str(me.rank),
                "LOCAL_RANK": str(me.local_rank),
                "WORLD_SIZE": str(me.world),
                "LOCAL_WORLD_SIZE": str(me.local_world),
                "GROUP_RANK": str(me.node),
            }
        )
    run_dir = spec.run_dir
    _requeue_shim(out, run_dir, me.rank)
    out[RUN_DIR_ENV] = run_dir
    out[CHECKPOINT_DIR_ENV] = str(Path(run_dir) / CHECKPOINT_DIR)
    out[PROGRESS_FILE_ENV] = str(progress_path(run_dir, me.rank))
    return out


def _requeue_shim(out: dict[str, str], run_dir: str, rank: int) -> None:
    """In a Slurm job, put meshrun's ``scontrol`` (launcher/taskwrap/bin) first on
    the program's PATH: at a stop the supervisor's requeue is the only one
    (a program's own ``scontrol requeue`` of its job is answered while the
    task's stop mark exists, not run); otherwise every call is Slurm's."""
    real = shutil.which("scontrol", path=out.get("PATH"))
    if not out.get("SLURM_JOB_ID") or not real or Path(real).parent == SHIM_DIR:
        return
    out[REAL_SCONTROL_ENV] = real
    out[REQUEUE_ASKED_ENV] = str(Path(run_dir) / PROGRESS_DIR / REQUEUE_ASKED)
    out[STOPPING_ENV] = str(stopping_path(run_dir, rank))
    out["PATH"] = f"{SHIM_DIR}{os.pathsep}{out.get('PATH', '')}"


def program_cwd(spec: RunSpec, env: dict[str, str]) -> str:
    """The run's own copy of the packed project a Slurm job runs (the code as
    submitted; launcher/taskwrap/workcopy.py), else job.workdir (a live run).
    A packed project that is gone is an error, never the live tree instead."""
    packed = env.get(PROJECT_DIR_ENV, "")
    if not packed:
        return spec.cfg.job.workdir
    if not os.path.isdir(packed):
        raise missing_entry(packed, spec.cfg.job.workdir)
    return run_workdir(spec.run_dir, packed)


def program_argv(spec: RunSpec, me: Ranks, env: dict[str, str], cwd: str, resume: str = "") -> list[str]:
    """The program's argv: python + script (mapped into the packed copy when
    it lies in job.workdir) or -m module, then job.args verbatim and, when
    ``resume`` (the newest match of job.resume_from) is set, job.resume_args
    naming it; under torchrun, torch.distributed.run in front, rendezvous on
    the first node."""
    j = spec.cfg.job
    target = ["-m", j.module] if j.module else [_in_copy(j.script, j.workdir, cwd)]
    args = [*j.args, *resume_argv(j.resume_args, resume)]
    if j.launch != "torchrun":
        return [j.python, *target, *args]
    addr, port = rendezvous(env)
    run_id = env.get("SLURM_JOB_ID") or spec.run_id or "meshrun"
    return [
        j.python,
        "-m",
        "torch.distributed.run",
        f"--nnodes={spec.plan.nodes}",
        f"--nproc-per-node={spec.plan.ranks_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={addr}:{port}",
        f"--rdzv-id={run_id}",
        "--max-restarts=0",  # restarts are the supervisor's, on healthy nodes
        *target,
        *args,
    ]


def _in_copy(script: str, workdir: str, cwd: str) -> str:
    if cwd == workdir:
        return script
    try:
        return str(Path(cwd) / Path(script).relative_to(workdir))
    except ValueError:
        return script  # outside the project dir: not packed, run where it is


def stop_window_s(spec: RunSpec, signum: int, env: dict[str, str]) -> float:
    """Seconds the program gets to stop after meshrun's signal (as the
    trainer's train.loop.signals.stop_budget_s): USR2 comes the signal lead
    before the limit, SIGTERM KillWait before SIGKILL; less the exit margin."""
    lead = float(spec.plan.signal_lead_s or spec.cfg.launcher.signal_lead_s or 120)
    grace = float(spec.cfg.qos.grace_time_s)
    try:
        kill_wait = float(env.get("MESHRUN_KILL_WAIT_S") or DEFAULT_KILL_WAIT_S)
    except ValueError:
        kill_wait = DEFAULT_KILL_WAIT_S
    window = min(grace, kill_wait) if signum == signal.SIGTERM else min(lead, grace)
    return max(1.0, window - stop_margin_s(window))
