"""Everything checked about a run before anything is written: the single run
(``launcher/__main__.py``) and every sweep point (hydra_plugins/meshrun_launcher)
go through :func:`prepare`, so a point is refused for the same reasons, with
the same message, as the same run on its own."""

from __future__ import annotations

from pathlib import Path

from launcher import nccl
from launcher.local import use_local_gpus
from launcher.plan import make_plan
from launcher.rundir import check_run_dir
from launcher.schema import RunConfig
from launcher.spec import RunSpec


def prepare(cfg: RunConfig, run_dir: str) -> RunSpec:
    """Plan and check ``cfg`` for ``run_dir``; :class:`ConfigError` on a refusal.
    Reads (data, a local image), never writes."""
    check_run_dir(run_dir)  # before the path is resolved: a name too long must not raise OSError
    use_local_gpus(cfg.cluster)
    nccl.apply(cfg.cluster)  # fabric NCCL preset + cluster.env -> what tasks export
    spec = RunSpec(cfg=cfg, plan=make_plan(cfg), run_dir=str(Path(run_dir).resolve()))
    if cfg.cluster.kind == "local" and cfg.data.kind != "synthetic":
        # A local run (dry or not) reads its data here: fail on a bad dataset
        # once, before anything is written or started (torch-free).
        from train.data import check_data

        check_data(cfg)
    if cfg.cluster.kind == "slurm" and not cfg.launcher.dry_run:
        from launcher.container import check_image

        check_image(cfg.cluster.container_image)  # a local image must exist before submission
    return spec
