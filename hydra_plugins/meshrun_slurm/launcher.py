"""``hydra/launcher=meshrun_slurm``: any Hydra app's sweep on meshrun's
machinery. Each point's task function and config are pickled the way
submitit does (DelayedSubmission) and run as a ``job=script`` run of
meshrun (task.py under launcher/taskwrap/wrapper.py): on Slurm, ONE job array
per sweep through meshrun's own array submission (the sweep launcher's:
checks, code snapshot, run record, the sbatch script with NCCL env, Pyxis,
preflight, USR2 lead, requeue at preemption, the supervisor); with
``cluster=local`` each point through meshrun's local run, one after
another. The launch waits, like hydra-submitit-launcher's, and returns each
point's JobReturn (Hydra's own ``run_job`` in the task: job dir =
``hydra.sweep.dir``/``hydra.sweep.subdir``, ``hydra.job.num``), read back
from the run dir's result pickle. The run dir is the Hydra job dir, so
goodput.json, status and the fleet see every point."""

import logging
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

from hydra_plugins.meshrun_slurm.config import MeshrunSlurmConf
from hydra_plugins.meshrun_slurm.point import RESULT, pending_return, run_point
from hydra_plugins.meshrun_slurm.settings import meshrun_overrides, sbatch_extra

log = logging.getLogger(__name__)
TASK_PY = Path(__file__).with_name("task.py")
SACCT_LAG_S = 60.0
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL", "DEADLINE"}


@dataclass
class Pickle:
    path: str  # <sweep dir>/.meshrun_slurm/<num>.pkl, the program's first argument
    submission: Any  # submitit's DelayedSubmission of point.run_point
    config: Any  # the point's composed Hydra config (its JobReturn when not waiting)
    meshrun: list[str] = field(default_factory=list)  # the meshrun overrides of its run


class MeshrunSlurmLauncher(Launcher):
    def __init__(self, **params: Any) -> None:
        self.params = params
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None
        self.job_ids: list[str] = []
        self.singletons: dict[Any, Any] = {}  # each point's Slurm job (array task) of the last launch

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        """Hydra's launch; meshrun's refusal is one ``meshrun: error:`` line
        and exit 2 (a Slurm error: exit 1), as on meshrun's command line."""
        from launcher.config.validate import ConfigError
        from launcher.slurm.cluster import SlurmError

        try:
            return self._launch(job_overrides, initial_job_idx)
        except (ConfigError, SlurmError) as e:
            print(f"meshrun: error: {e}", file=sys.stderr, flush=True)
            raise SystemExit(2 if isinstance(e, ConfigError) else 1) from None

    def _launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from launcher.config.validate import ConfigError, fail

        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        conf = OmegaConf.structured(MeshrunSlurmConf(**self.params))
        extra = sbatch_extra(conf)  # checked in every mode, before anything is written
        if not conf.wait:
            check_no_wait(self.config)
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).resolve()
        sweep_dir.mkdir(parents=True, exist_ok=True)
        log.info(f"meshrun_slurm: launching {len(job_overrides)} jobs on cluster={conf.cluster}")
        # Hydra's singletons as the app made them (composing meshrun's config adds its schema).
        self.singletons = Singleton.get_state()
        points = [self._point(initial_job_idx + i, o, sweep_dir, conf) for i, o in enumerate(job_overrides)]
        specs = {num: spec for num, (spec, _) in enumerate(points)}
        if specs[0].cfg.cluster.login:  # a cluster behind its login node: the sweep is submitted there
            from hydra_plugins.meshrun_slurm.overssh import launch_over_ssh

            return launch_over_ssh(self, job_overrides, initial_job_idx, conf, extra, specs[0])
        if not conf.wait and specs[0].cfg.cluster.kind != "slurm":
            raise fail(
                "hydra.launcher.wait",
                False,
                f"returns at once only on Slurm: cluster={conf.cluster} runs "
                "each point here, in turn; set hydra.launcher.wait=true or a Slurm cluster",
            )
        for _spec, pickle in points:  # every point checked first: a refused sweep writes no pickle
            Path(pickle.path).parent.mkdir(exist_ok=True)
            pickle.submission.dump(pickle.path)
        if specs[0].cfg.cluster.kind == "slurm":
            self.job_ids = self._submit(specs, job_overrides, sweep_dir, extra)
            if not conf.wait:  # return at once: each point's value its run handle
                return self._pending(points, sweep_dir)
            self._wait(specs, conf)
        else:
            from launcher.entry.launch import launch

            for spec, _ in points:
                code = launch(spec.cfg, spec.run_dir)
                if code == 2:
                    raise ConfigError(f"meshrun refused the point's run in {spec.run_dir} (see above)")
        returns = [self._result(spec, o) for (spec, _), o in zip(points, job_overrides, strict=True)]
        for num, ret in enumerate(returns):
            said = f"returned {ret._return_value!r}" if ret.status == JobStatus.COMPLETED else "failed"
            log.info(
                f"meshrun_slurm: #{initial_job_idx + num} {' '.join(ret.overrides or [])}: {ret.status.name}, {said}"
            )
        return returns

    def _point(
        self, num: int, overrides: Sequence[str], sweep_dir: Path, conf: DictConfig, *, pin: bool = False
    ) -> tuple[Any, "Pickle"]:
        """(the point's checked meshrun RunSpec, its pickle): the Hydra
        config composed as the job will see it, pickled with the task
        function (submitit's DelayedSubmission), and meshrun's run of it.
        ``pin``: the job's ``hydra.sweep.dir`` is ``sweep_dir`` (the one on the cluster)."""
        from submitit.core.utils import DelayedSubmission

        from launcher.run.prepare import prepare

        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        with open_dict(sweep_config):
            sweep_config.hydra.job.id = f"pending_{num}"  # the Slurm job id, set in the job (point.py)
            sweep_config.hydra.job.num = num
            if pin:
                sweep_config.hydra.sweep.dir = str(sweep_dir)
        run_dir = sweep_dir / str(sweep_config.hydra.sweep.subdir)
        submission = sweep_dir / ".meshrun_slurm" / f"{num}.pkl"
        delayed = DelayedSubmission(
            run_point, self.hydra_context, self.task_function, sweep_config, self.singletons
        )
        mine = meshrun_overrides(conf, sweep_config, str(TASK_PY), [str(submission), str(run_dir / RESULT)])
        spec = prepare(compose_meshrun(mine), str(run_dir))
        check_tasks_per_node(conf, spec)
        return spec, Pickle(str(submission), delayed, sweep_config, mine)

    def _submit(
        self,
        specs: dict[int, Any],
        job_overrides: Sequence[Sequence[str]],
        sweep_dir: Path,
        extra: dict[str, str],
    ) -> list[str]:
        """One job array through meshrun's own sweep submission (the same
        checks, snapshot, run record, sbatch script and undo on refusal)."""
        return submit_points(specs, [list(filter_overrides(o)) for o in job_overrides], sweep_dir, extra)

    def _wait(self, specs: dict[int, Any], conf: DictConfig) -> None:
        """Until every point has its result or its job ended (a requeued
        point is PENDING again and waited for)."""
        from launcher.slurm.cluster import jobs

        left = dict(zip(self.job_ids, specs.values(), strict=True))
        unlisted: dict[str, float] = {}  # a task with its result that sacct does not list yet: since when
        while left:
            states = jobs(list(left))
            for jid, spec in list(left.items()):
                state = states[jid].state if jid in states else ""
                # Ended: the batch script's teardown ran (goodput.json). sacct
                # lists an array task late: its result is enough after SACCT_LAG_S.
                if not state and _outcome(spec) == "success":
                    unlisted.setdefault(jid, time.monotonic())
                if state in ENDED or time.monotonic() - unlisted.get(jid, math.inf) > SACCT_LAG_S:
                    del left[jid]
            if left:
                time.sleep(conf.poll_s)
        # Every point's goodput.json from sacct's record of its end: the
        # batch script's own write fails when sacct does not list an array
        # task yet (it says so in the job's log); a final one is kept.
        from launcher.views.goodputend import refresh

        refresh([(spec.run_dir, jid) for jid, spec in zip(self.job_ids, specs.values(), strict=True)])

    def _pending(self, points: list[tuple[Any, Pickle]], sweep_dir: Path) -> list[JobReturn]:
        """wait=false: each point's JobReturn now, its value meshrun's handle of the run."""
        from launcher.api import Run

        returns = [
            pending_return(pickle.config, spec.run_dir, jid, Run(spec.run_dir, jid))
            for (spec, pickle), jid in zip(points, self.job_ids, strict=True)
        ]
        log.info(f"meshrun_slurm: wait=false: returning at once; follow: meshrun status {sweep_dir}")
        return returns

    def _result(self, spec: Any, overrides: Sequence[str]) -> JobReturn:
        """The point's JobReturn as its task's run_job made it; a task that
        left no result: a failed JobReturn naming the run dir's logs."""
        from submitit.core.utils import pickle_load

        path = Path(spec.run_dir) / RESULT
        if path.exists():
            kind, value = pickle_load(path)
            if kind == "success":
                return value
            why = f"the task function raised:\n{value}"
        else:
            why = f"the point's job ended without a result ({path}); its logs: {spec.run_dir}/logs, failures.log"
        ret = JobReturn(overrides=list(overrides), status=JobStatus.FAILED, _return_value=RuntimeError(why))
        ret.working_dir = spec.run_dir
        return ret


def submit_points(
    specs: dict[int, Any], overrides: Sequence[list[str]], sweep_dir: Path, extra: dict[str, str]
) -> list[str]:
    """The checked points as one job array (the sweep launcher's submission),
    the sweep's manifest; each point's job id (the login node runs this too:
    overssh.py)."""
    from hydra_plugins.meshrun_launcher.meshrun_launcher import MeshrunLauncher
    from launcher.config.runid import new_run_id
    from launcher.slurm.cluster import SlurmError
    from launcher.slurm.submit import array_key

    if len({array_key(s) for s in specs.values()}) > 1:
        raise SlurmError("meshrun_slurm: every point of a sweep must make the same Slurm request (one array)")
    points = {n: {"point": n, "overrides": list(overrides[n]), "run_dir": specs[n].run_dir} for n in specs}
    sweep_id = new_run_id("hydra")
    # extra: the sbatch options meshrun has no field for (constraint, additional_parameters)
    MeshrunLauncher(check=True)._submit(specs, points, sweep_dir, sweep_id, extra=extra)
    # The sweep's manifest: `meshrun status <sweep dir>` and launcher.api.follow read it.
    MeshrunLauncher._write_manifest(points, sweep_dir, sweep_id)
    for n in sorted(points):
        if points[n].get("status") != "submitted":
            raise SlurmError(f"meshrun_slurm: point #{n} was not submitted: {points[n].get('reason')}")
    ids = [points[n]["job_id"] for n in sorted(points)]
    log.info(f"meshrun_slurm: submitted job array {points[0]['array']} ({len(ids)} tasks)")
    return ids


def _outcome(spec: Any) -> str:
    from submitit.core.utils import pickle_load

    path = Path(spec.run_dir) / RESULT
    return str(pickle_load(path)[0]) if path.exists() else ""


def compose_meshrun(overrides: list[str]) -> Any:
    """meshrun's RunConfig, composed while the app's own Hydra is active:
    Hydra's singletons are put aside and restored around it."""
    from hydra.core.global_hydra import GlobalHydra

    from launcher.config.compose import compose

    state = Singleton.get_state()
    GlobalHydra.instance().clear()
    try:
        return compose(overrides)
    finally:
        Singleton.set_state(state)


def check_no_wait(config: DictConfig) -> None:
    """wait=false hands back handles, not results: only Hydra's BasicSweeper,
    which reads none, may sweep so (Optuna, Ax, Nevergrad choose from results)."""
    from launcher.config.validate import fail

    target = str(config.hydra.sweeper.get("_target_", ""))
    if target != BASIC_SWEEPER:
        raise fail(
            "hydra.launcher.wait",
            False,
            f"the sweeper {target} chooses points from the results, which "
            "wait=false does not have (it returns run handles at submission); use wait=true, or "
            "hydra/sweeper=basic",
        )


def check_tasks_per_node(conf: DictConfig, spec: Any) -> None:
    from launcher.config.scriptjob import tasks_per_node
    from launcher.config.validate import fail

    want = conf.tasks_per_node
    have = tasks_per_node("script", spec.cfg.job.launch, spec.plan.ranks_per_node)
    if want is not None and want != have:
        raise fail(
            "hydra.launcher.tasks_per_node",
            want,
            f"meshrun starts one task per GPU: {have} per node on cluster={spec.cfg.cluster.name}; "
            "set gpus_per_node instead (or leave tasks_per_node unset)",
        )
