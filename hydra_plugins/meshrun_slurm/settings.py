"""hydra/launcher=meshrun_slurm's keys -> meshrun's overrides and the sbatch
options meshrun has no field for. Every value is quoted for Hydra's override
grammar (a path or regex with spaces, commas or quotes stays one value)."""

import re
from typing import Any

from omegaconf import DictConfig

# submitit's key -> meshrun's field (the same meaning; docs/hydra-launcher.md).
FIELDS = {
    "timeout_min": "qos.time_limit_min",
    "cpus_per_task": "launcher.cpus_per_task",
    "gpus_per_node": "cluster.gpus_per_node",
    "mem_gb": "launcher.mem_gb",
    "nodes": "cluster.nodes",
    "partition": "qos.partition",
    "qos": "qos.qos",
    "account": "qos.account",
    "signal_delay_s": "launcher.signal_lead_s",
    "container_image": "cluster.container_image",
    "preflight": "cluster.preflight",
    "max_restarts": "launcher.max_restarts",
    "login": "cluster.login",
}
# sbatch options meshrun's script sets itself: additional_parameters may not change them.
OWN_OPTIONS = {
    "time", "partition", "qos", "account", "nodes", "ntasks_per_node", "gres", "gpus_per_node", "mem",
    "cpus_per_task", "comment", "signal", "requeue", "array", "job_name", "output", "error", "exclusive",
    "dependency", "exclude", "open_mode", "wckey",
}  # fmt: skip
OPTION = re.compile(r"^[a-z][a-z0-9_-]*$")


def q(value: Any) -> str:
    """One Hydra override value, quoted (bools and numbers as they are)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return str(value)
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def meshrun_overrides(conf: DictConfig, sweep_config: DictConfig, task_py: str, args: list[str]) -> list[str]:
    """The point's meshrun run: job=script running task.py on the pickle,
    from the app's working directory, with the launcher's keys mapped."""
    out = [
        f"cluster={conf.cluster}",
        f"qos={conf.qos_preset}",
        "job=script",
        f"job.script={q(task_py)}",
        f"job.args=[{','.join(q(a) for a in args)}]",
        f"job.workdir={q(sweep_config.hydra.runtime.cwd)}",
        f"job.progress_regex={q(conf.progress_regex)}",
        f"launcher.job_name={q(conf.name)}",
        # hydra-submitit-launcher's defaults: a share of a node (CPUs and
        # memory in proportion to the GPUs asked, render.py), not all of it;
        # the app's dir (job.workdir) and meshrun run from the code snapshot
        # (meshrun's default), so a queued point runs the code as submitted.
        "launcher.exclusive=false",
        "cluster.local_processes=1",  # cluster=local: the function once, as submitit_local's one task
    ]
    out += [f"{field}={q(conf[key])}" for key, field in FIELDS.items() if conf[key] is not None]
    return out + list(conf.overrides)


def sbatch_extra(conf: DictConfig) -> dict[str, str]:
    """``constraint`` and ``additional_parameters`` as sbatch options
    (submitit writes ``#SBATCH --key=value``); a refused one names its key."""
    from launcher.config.validate import fail

    extra: dict[str, Any] = dict(conf.additional_parameters)
    if conf.constraint is not None:
        extra["constraint"] = conf.constraint
    for key, value in extra.items():
        where = (
            f"hydra.launcher.additional_parameters.{key}"
            if key != "constraint"
            else "hydra.launcher.constraint"
        )
        if not OPTION.match(key):
            raise fail(where, key, "an sbatch option name: lower case letters, digits, '_' or '-'")
        if key.replace("-", "_") in OWN_OPTIONS:
            raise fail(where, value, f"meshrun sets --{key.replace('_', '-')} itself; use its own key")
        if any(ord(c) < 32 or ord(c) == 127 for c in str(value)):
            raise fail(where, str(value), "one line of printable text (no control characters)")
    return {k: str(v) for k, v in extra.items()}
