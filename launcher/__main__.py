"""``python -m launcher [group=option ...] [key=value ...]``

Compose (Hydra) -> plan and validate -> then one of:
- ``launcher.dry_run=true``: print the plan and the exact sbatch script; exit 0;
- ``cluster=local`` (the default): run the job on this machine;
- a Slurm cluster: submit with submitit and return at once.

Hydra's ``--help``, ``--cfg job``, ``--info`` and ``-m`` work as usual.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from launcher import nccl
from launcher.compose import CONF_DIR, to_run_config
from launcher.configstore import register
from launcher.fit import fit_to_qos_share
from launcher.local import run_local, use_local_gpus
from launcher.plan import Plan, make_plan, plan_layout_summary
from launcher.report import print_plan
from launcher.rundir import check_resume, write_run_dir
from launcher.runid import new_run_id, read_run_id, run_name
from launcher.runlock import check_slurm_owner, own_run_dir
from launcher.schema import RunConfig
from launcher.spec import RunSpec
from launcher.validate import ConfigError

register()


def _submit_errors() -> tuple[type[BaseException], ...]:
    """Slurm-side failures, reported in one line instead of a traceback."""
    from submitit.core.utils import FailedJobError, FailedSubmissionError

    from launcher.slurm import SlurmUnavailable

    return (SlurmUnavailable, FailedJobError, FailedSubmissionError, subprocess.CalledProcessError)


def _error(msg: str) -> None:
    print(f"meshrun: error: {msg}", file=sys.stderr)


def dry_run(spec: RunSpec) -> None:
    print_plan(spec.cfg, spec.plan)
    if spec.cfg.cluster.kind == "slurm":
        from launcher import slurm
        from launcher.render import render_sbatch

        print("\n# sbatch script submitit would submit:\n")
        print(render_sbatch(spec, Path(spec.run_dir) / "slurm"))
        if slurm_reachable():
            try:
                print(f"meshrun: sbatch --test-only: {slurm.test_only(spec)}")
            except slurm.SlurmUnavailable as e:
                print(f"meshrun: sbatch --test-only not possible: {e}")
    else:
        print(f"\n# would run {spec.plan.world_size} local ranks: python -m train {spec.run_dir}")
    print("meshrun: dry run, nothing was started or submitted")


def slurm_reachable() -> bool:
    return shutil.which("sbatch") is not None and shutil.which("squeue") is not None


def launch(cfg: RunConfig, run_dir: str) -> int:
    """Plan and act on one composed run; returns the process exit code."""
    use_local_gpus(cfg.cluster)
    nccl.apply(cfg.cluster)  # fabric NCCL preset + cluster.env -> what tasks export
    plan: Plan = make_plan(cfg)
    spec = RunSpec(cfg=cfg, plan=plan, run_dir=str(Path(run_dir).resolve()))
    if cfg.cluster.kind == "local" and cfg.data.kind != "synthetic":
        # A local run (dry or not) reads its data here: fail on a bad dataset
        # once, before anything is written or started (torch-free).
        from train.data import check_data

        check_data(cfg)
    if cfg.launcher.dry_run:
        # Shown, not stored: a new run's id is given at its first real start.
        spec.run_id = read_run_id(spec.run_dir) or new_run_id(run_name(cfg))
        dry_run(spec)
        return 0
    if cfg.cluster.kind == "slurm":
        if not slurm_reachable():
            raise ConfigError(
                f"cluster={cfg.cluster.name} is a Slurm cluster but no Slurm is reachable from here "
                "(sbatch/squeue not found). Use cluster=local to run on this machine, or "
                "launcher.dry_run=true to see the plan and the sbatch script."
            )
        from launcher.container import check_image
        from launcher.submit import submit_run

        check_image(cfg.cluster.container_image)  # before any file is written
        check_slurm_owner(spec.run_dir)
        check_resume(spec)
        write_run_dir(spec)
        job_id = submit_run(spec)
        print(f"meshrun: submitted job {job_id}: {plan_layout_summary(plan)}")
        print(f"meshrun: run dir {spec.run_dir}  (status: python -m launcher.status {spec.run_dir})")
        return 0
    # One owner per run dir, held until the ranks are gone (launcher/runlock.py).
    with own_run_dir(spec.run_dir):
        if slurm_reachable():
            check_slurm_owner(spec.run_dir)  # a run dir last submitted to Slurm
        check_resume(spec)
        write_run_dir(spec)
        print(f"meshrun: {plan_layout_summary(plan)}; run {spec.run_id} in {spec.run_dir}", flush=True)
        code = run_local(spec)
    result = Path(spec.run_dir) / "result.json"
    if code == 0 and result.exists():
        r = json.loads(result.read_text())
        print(f"meshrun: {r.get('status')} at step {r.get('final_step')}, loss {r.get('final_loss')}")
    print(
        f"meshrun: resume or extend with: python -m launcher launcher.run_dir={spec.run_dir} [train.steps=N]"
    )
    return code


@hydra.main(version_base=None, config_path=CONF_DIR, config_name="config")
def main(cfg: DictConfig) -> None:
    hc = HydraConfig.get()
    run_cfg = to_run_config(cfg)
    note = fit_to_qos_share(run_cfg, hc.overrides.task)
    if note:
        print(f"meshrun: {note}")
    run_dir = run_cfg.launcher.run_dir or hc.runtime.output_dir
    try:
        code = launch(run_cfg, run_dir)
    except ConfigError as e:
        _error(str(e))
        if hc.mode == RunMode.MULTIRUN:
            return  # one bad sweep point must not stop the others
        sys.exit(2)
    except Exception as e:
        if not isinstance(e, _submit_errors()):
            raise
        _error(f"submission failed: {e}".strip())
        sys.exit(3)
    if code:
        sys.exit(code)


def refuse_credentials(argv: list[str]) -> None:
    """Credentials typed on the command line are refused before Hydra runs:
    it would repeat them in its errors and copy them into its output dir."""
    from launcher.secrets import override_findings, refusal

    found = override_findings(argv)
    if found:
        _error(refusal(found[0]))
        sys.exit(2)


if __name__ == "__main__":
    refuse_credentials(sys.argv[1:])
    main()
