"""One sweep point of a Hydra app, inside its meshrun task: what the
launcher pickles (submitit's DelayedSubmission) and task.py runs, as
hydra-submitit-launcher's ``__call__`` does: Hydra's globals and singletons
restored, ``hydra.job.id`` set from the Slurm job, then Hydra's own
``run_job`` (job dir, ``.hydra/``, the job log, callbacks)."""

import os
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, run_job, setup_globals
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

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
