"""One sweep point of a Hydra app, inside its meshrun task: what the
launcher pickles (submitit's DelayedSubmission) and task.py runs, as
hydra-submitit-launcher's ``__call__`` does: Hydra's globals and singletons
restored, ``hydra.job.id`` set from the Slurm job, then Hydra's own
``run_job`` (job dir, ``.hydra/``, the job log, callbacks)."""

import copy
import os
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, _save_config, run_job, setup_globals
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

RESULT = "hydra_result.pkl"  # in the run dir: ("success", JobReturn) or ("error", traceback)


def job_id() -> str:
    """The Slurm job (array task) id, as submitit's JobEnvironment names it; local: meshrun's run id."""
    array = os.environ.get("SLURM_ARRAY_JOB_ID")
    if array:
        return f"{array}_{os.environ.get('SLURM_ARRAY_TASK_ID', '0')}"
    return os.environ.get("SLURM_JOB_ID") or os.environ.get("MESHRUN_RUN_ID", "local")


def run_point(
    hydra_context: HydraContext,
    task_function: TaskFunction,
    sweep_config: DictConfig,
    singleton_state: dict[Any, Any],
) -> JobReturn:
    setup_globals()
    Singleton.set_state(singleton_state)
    with open_dict(sweep_config.hydra.job):
        sweep_config.hydra.job.id = job_id()
    return run_job(
        hydra_context=hydra_context,
        task_function=task_function,
        config=sweep_config,
        job_dir_key="hydra.sweep.dir",
        job_subdir_key="hydra.sweep.subdir",
    )


def pending_return(
    sweep_config: DictConfig, run_dir: str, job: str, handle: Any, *, write: bool = True
) -> JobReturn:
    """``hydra.launcher.wait=false``: the point's JobReturn at submission,
    COMPLETED (submitted) with meshrun's run handle as its value, its job dir's
    ``.hydra/`` written as ``run_job`` writes it (the task writes it again;
    ``write=False``: a job dir on a cluster reached over SSH, written there by the task only)."""
    config = copy.deepcopy(sweep_config)
    with open_dict(config.hydra):
        config.hydra.job.id = job
        config.hydra.runtime.output_dir = run_dir
    task_cfg = copy.deepcopy(config)
    with open_dict(task_cfg):
        del task_cfg["hydra"]
    hydra_cfg = OmegaConf.create({"hydra": config.hydra})
    if write and config.hydra.output_subdir is not None:
        out = Path(run_dir) / str(config.hydra.output_subdir)
        _save_config(task_cfg, "config.yaml", out)
        _save_config(hydra_cfg, "hydra.yaml", out)
        _save_config(config.hydra.overrides.task, "overrides.yaml", out)
    overrides = OmegaConf.to_container(config.hydra.overrides.task)
    ret = JobReturn(overrides=list(overrides), cfg=task_cfg, hydra_cfg=hydra_cfg, working_dir=run_dir)
    ret.task_name, ret.status, ret.return_value = str(config.hydra.job.name), JobStatus.COMPLETED, handle
    return ret
