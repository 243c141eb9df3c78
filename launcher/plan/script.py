"""``job=script``: the checks of a team's own program and its plan.

meshrun cannot shard a foreign program: the plan is its data-parallel world
(nodes x ranks per node), nothing more; no model, memory or price. Every
check runs before anything is written (launcher/run/prepare.py); a refusal
names the field, the value and what would be valid.
"""

from __future__ import annotations

import keyword
import os
import re
import shutil
import sys
from pathlib import Path

from launcher.config.plandata import MemoryEstimate, Plan
from launcher.config.schema import RunConfig
from launcher.config.scriptjob import RESUME_FIELDS, project_root, resume_pattern_problem
from launcher.config.validate import fail
from launcher.plan.candidates import ranks_per_node

# Signals a program may be asked to stop with (not KILL/STOP: uncatchable,
# not URG: the supervisor's stack signal).
STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP", "SIGQUIT")
# The signals torchrun's agent passes on to its workers (torch.distributed.elastic:
# TORCHELASTIC_SIGNALS_TO_HANDLE's default). Any other kills the agent and
# orphans its workers (SIGUSR1), or never reaches them (SIGUSR2).
TORCHRUN_FORWARDS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


def _abs(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path)) if path else path


def check_script(cfg: RunConfig) -> None:
    """Every job.* field of a script job; fills job.python and job.workdir
    and makes paths absolute. Raises ConfigError."""
    j = cfg.job
    if bool(j.script) == bool(j.module):
        raise fail(
            "job.script" if j.script else "job.module",
            j.script or j.module,
            "job=script runs one program: set exactly one of job.script=FILE or job.module=NAME (python -m)",
        )
    if j.script:
        j.script = _script_path(j.script, j.workdir)
        if not Path(j.script).is_file():
            raise fail("job.script", j.script, "no such file (the program to run, e.g. train.py)")
    elif not all(part.isidentifier() and not keyword.iskeyword(part) for part in j.module.split(".")):
        raise fail("job.module", j.module, "a dotted module name for python -m (e.g. mypkg.train)")
    if not isinstance(j.args, list) or not all(isinstance(a, str) for a in j.args):
        raise fail("job.args", j.args, "a list of strings, passed verbatim, e.g. job.args=[--epochs,2]")
    _check_python(cfg)
    j.workdir = _abs(j.workdir) or (project_root(j.script) if j.script else os.getcwd())
    for name in ("script", "workdir"):  # paths that reach the job script (mounts, the packed copy)
        if re.search(r"[\x00-\x1f\x7f]", getattr(j, name)):
            raise fail(
                f"job.{name}", getattr(j, name), "must not contain control characters (newline, tab, ...)"
            )
    if not Path(j.workdir).is_dir():
        raise fail("job.workdir", j.workdir, "not a directory (where the program starts)")
    if cfg.cluster.container_image and re.search(r"[,:]", j.workdir):
        # Mounted into the container at the same path: Pyxis splits mounts at ',' and ':'.
        raise fail("job.workdir", j.workdir, "must not contain ',' or ':' with a container image (a mount)")
    if j.stop_signal not in STOP_SIGNALS:
        raise fail("job.stop_signal", j.stop_signal, f"choose one of {', '.join(STOP_SIGNALS)}")
    if j.launch == "torchrun" and j.stop_signal not in TORCHRUN_FORWARDS:
        raise fail(
            "job.stop_signal",
            j.stop_signal,
            f"job.launch=torchrun passes only {', '.join(TORCHRUN_FORWARDS)} on to its workers: choose "
            "one of those, or job.launch=tasks (one task per GPU) for a program that saves on "
            f"{j.stop_signal} (Lightning's SIGUSR1)",
        )
    _check_regex(j.progress_regex)
    _check_resume(cfg)
    if j.elastic:
        raise fail(
            "job.elastic",
            True,
            "false only: meshrun restarts a failed program inside the allocation (launcher/selfheal/supervisor.py); "
            "changing membership while it runs is not supported",
        )
    _check_parallelism(cfg)


def _script_path(script: str, workdir: str) -> str:
    """``job.script`` made absolute: relative to where meshrun runs, else
    (no such file there) to ``job.workdir`` when that is given."""
    here = _abs(script)
    if Path(here).is_file() or not workdir or os.path.isabs(os.path.expanduser(script)):
        return here
    there = os.path.join(_abs(workdir), script)
    return os.path.normpath(there) if Path(there).is_file() else here


def _check_python(cfg: RunConfig) -> None:
    j, c = cfg.job, cfg.cluster
    if not j.python:
        j.python = c.container_python if c.container_image else sys.executable
        return
    if c.container_image or c.login:
        return  # a path inside the image, or on the cluster (cluster.login): it cannot be looked at from here
    found = shutil.which(j.python) if os.sep not in j.python else _abs(j.python)
    if not found or not os.path.isfile(found) or not os.access(found, os.X_OK):
        raise fail("job.python", j.python, "no such interpreter (an executable path or a command on PATH)")
    j.python = found


def _check_regex(pattern: str) -> None:
    if not pattern:
        return  # no parsing: progress only from the progress file
    try:
        compiled = re.compile(pattern)
    except re.error as e:
        raise fail("job.progress_regex", pattern, f"not a regular expression ({e})") from e
    if compiled.groups < 1:
        raise fail("job.progress_regex", pattern, r"needs a group capturing the step number, e.g. step (\d+)")


def _check_resume(cfg: RunConfig) -> None:
    j = cfg.job
    if not isinstance(j.resume_args, list) or not all(isinstance(a, str) for a in j.resume_args):
        raise fail(
            "job.resume_args", j.resume_args, "a list of strings, e.g. [--resume_from_checkpoint,{path}]"
        )
    if j.resume_from and not j.resume_args:
        raise fail(
            "job.resume_args",
            j.resume_args,
            "the arguments that tell the program where to resume, with {path} for the newest match of "
            f"job.resume_from={j.resume_from}, e.g. job.resume_args=[--resume_from_checkpoint,{{path}}]",
        )
    if j.resume_args and not j.resume_from:
        raise fail(
            "job.resume_from",
            "",
            "a glob of the program's checkpoints (e.g. out/checkpoint-*) for job.resume_args to name",
        )
    if re.search(r"[\x00-\x1f\x7f]", j.resume_from):
        raise fail(
            "job.resume_from", j.resume_from, "must not contain control characters (newline, tab, ...)"
        )
    why = resume_pattern_problem(j.resume_from) if j.resume_from else None
    if why:
        raise fail("job.resume_from", j.resume_from, f"is not a usable glob ({why}), e.g. out/checkpoint-*")
    for arg in j.resume_args:
        bad = [m for m in re.findall(r"\{(\w*)\}", arg) if m not in RESUME_FIELDS]
        if bad:
            raise fail(
                "job.resume_args",
                j.resume_args,
                f"{{{bad[0]}}} is not known: {{path}} (the newest match of job.resume_from) or {{dir}} (its folder)",
            )


def _check_parallelism(cfg: RunConfig) -> None:
    p = cfg.parallelism
    for name in ("tp", "pp"):
        if getattr(p, name) > 1:
            raise fail(
                f"parallelism.{name}",
                getattr(p, name),
                "job=script runs your program as it is: only the data-parallel world size "
                "(cluster.nodes x GPUs per node) applies; set it to 0 or 1",
            )


def plan_script(cfg: RunConfig) -> Plan:
    """The plan of a script job: its world, one data-parallel replica per rank."""
    rpn, device = ranks_per_node(cfg)
    world = cfg.cluster.nodes * rpn
    memory = MemoryEstimate(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, capacity_gb=0.0)
    target = cfg.job.script or f"-m {cfg.job.module}"
    return Plan(
        world_size=world,
        nodes=cfg.cluster.nodes,
        ranks_per_node=rpn,
        device=device,
        backend="nccl" if device == "cuda" else "gloo",
        mode="script",
        dp_replicate=world,
        dp_shard=1,
        tp=1,
        pp=1,
        stages_per_rank=1,
        pp_schedule=cfg.parallelism.pp_schedule,
        pp_microbatches=0,
        global_batch_size=world,
        micro_batch_size=1,
        grad_accum_steps=1,
        activation_checkpointing="none",
        precision="auto",
        compile=False,
        flops_per_token=0.0,
        gpu_peak_bf16_tflops=cfg.cluster.gpu_peak_bf16_tflops,
        params=0,
        memory=memory,
        cost=None,
        reasons=[f"job=script: {target} on {world} rank(s) ({cfg.job.launch}); its own layout inside"],
    )
