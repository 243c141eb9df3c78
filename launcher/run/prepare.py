"""Everything checked about a run before anything is written: the single run
(``launcher/__main__.py``) and every sweep point (hydra_plugins/meshrun_launcher)
go through :func:`prepare`, so a point is refused for the same reasons, with
the same message, as the same run on its own."""

from __future__ import annotations

from pathlib import Path

from launcher.config import ncclenv as nccl
from launcher.config.schema import RunConfig
from launcher.config.spec import RunSpec
from launcher.plan.make import (
    check_in_process,
    check_in_process_layout,
    check_input,
    plan_stop_lead,
    price,
    record_cpu_peak,
)
from launcher.plan.planner import plan_layout
from launcher.run.codesnap import plan_code
from launcher.run.local import use_local_gpus
from launcher.run.rundir import check_run_dir


def prepare(cfg: RunConfig, run_dir: str) -> RunSpec:
    """Plan and check ``cfg`` for ``run_dir``; :class:`ConfigError` on a refusal.
    Reads (data, a local image), never writes."""
    if not cfg.cluster.login:  # a run dir on the cluster is checked there (launcher/entry/sshsubmit.py)
        check_run_dir(run_dir)  # before the path is resolved: a name too long must not raise OSError
    use_local_gpus(cfg.cluster)
    nccl.apply(cfg.cluster)  # fabric NCCL preset + cluster.env -> what tasks export
    # The run's path: check -> plan -> price -> stop lead, then what reads disk.
    check_in_process(cfg)  # before the job's own checks: it names what this option supports
    check_input(cfg)
    plan = plan_layout(cfg)
    check_in_process_layout(cfg, plan)
    price(cfg, plan)
    plan_stop_lead(cfg, plan)
    record_cpu_peak(cfg, plan)
    spec = RunSpec(cfg=cfg, plan=plan, run_dir=str(Path(run_dir).resolve()))
    if cfg.cluster.kind == "local" and cfg.data.kind != "synthetic":
        # A local run (dry or not) reads its data here: fail on a bad dataset
        # once, before anything is written or started (torch-free).
        from launcher.config.datasets import check_data

        check_data(cfg)
    # The code it would pack: over launcher.code_max_mb, or dirty under launcher.code=clean: refused.
    plan_code(cfg)
    if cfg.cluster.kind == "slurm" and not cfg.launcher.dry_run and not cfg.cluster.login:
        from launcher.slurm.container import check_image

        check_image(
            cfg.cluster.container_image
        )  # a local image must exist before submission (there: checked there)
    return spec
