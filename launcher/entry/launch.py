"""How a composed run enters: its dry run, a local launch, a Slurm submission.

One sequence for every front end: ``meshrun run`` (launcher/commands/run.py),
the Python API (launcher/api.py), pipelines (launcher/commands/pipeline.py)
and the Hydra plugins (hydra_plugins/).
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from launcher.config.compose import to_run_config
from launcher.config.runfiles import RESULT_FILE
from launcher.config.runid import new_run_id, read_run_id, run_name
from launcher.config.schema import RunConfig
from launcher.config.spec import RunSpec
from launcher.config.validate import ConfigError
from launcher.plan.planner import plan_layout_summary
from launcher.plan.qosshare import share_note
from launcher.run.codesnap import describe, plan_snapshot, snapshot_run
from launcher.run.continuation import continued_config
from launcher.run.local import run_local
from launcher.run.prepare import prepare
from launcher.run.record import write_record
from launcher.run.rundir import check_resume, default_run_dir, finished_message, write_run_dir
from launcher.run.runlock import check_slurm_owner, own_run_dir
from launcher.run.submission import SubmissionFailed, submit_runs
from launcher.views.planreport import print_plan
from launcher.views.runsummary import write_local_goodput


def error(msg: str) -> None:
    print(f"meshrun: error: {msg}", file=sys.stderr)


def sbatch_text(spec: RunSpec) -> tuple[str, str]:
    """(what the code snapshot would pack, the exact sbatch script) of a Slurm run:
    the dry run's, and launcher/api.py's ``plan()``."""
    from launcher.slurm.render import render_sbatch

    snap = plan_snapshot(spec.cfg)
    script = render_sbatch(
        spec, Path(spec.run_dir) / "slurm", code_dir=snap.meshrun_dir, project_dir=snap.project_dir
    )
    return describe(snap, planned=True), script


@dataclass(frozen=True)
class Verdict:
    """What Slurm says of a request before anything is submitted: the dry
    run's lines and :func:`launcher.api.plan`'s data come from this one call."""

    asked: bool  # Slurm was asked (reachable); else ``note`` is the preset's QOS share
    refused: str | None = None  # a submission here would be refused: why
    test_only: str | None = None  # sbatch --test-only's answer (where and when it would start)
    unasked: str | None = None  # why Slurm could not be asked
    note: str | None = None  # without Slurm: the request against the preset's QOS share


def slurm_verdict(spec: RunSpec) -> Verdict:
    """The request as typed, against this cluster's partition and QOS limits:
    said, not refused (a dry run submits nothing)."""
    from launcher.slurm import cluster as slurm

    # A cluster behind its login node is asked there over ssh, never this machine's Slurm.
    if not spec.cfg.cluster.login and not slurm.slurm_reachable():
        return Verdict(asked=False, note=share_note(spec.cfg))
    try:
        slurm.check_request(spec)
        return Verdict(asked=True, test_only=slurm.test_only(spec))
    except slurm.SlurmUnavailable as e:
        return Verdict(asked=False, unasked=str(e), note=share_note(spec.cfg))
    except (ConfigError, slurm.SlurmError) as e:
        return Verdict(asked=True, refused=str(e))


def dry_run(spec: RunSpec) -> None:
    print_plan(spec.cfg, spec.plan)
    if spec.cfg.cluster.kind == "slurm":
        snap_said, script = sbatch_text(spec)
        print(f"meshrun: {snap_said}")
        print("\n# sbatch script submitit would submit:\n")
        print(script)
        v = slurm_verdict(spec)
        if v.unasked:
            print(f"meshrun: Slurm could not be asked about this request: {v.unasked}")
        if v.test_only:
            print(f"meshrun: sbatch --test-only: {v.test_only}")
        if v.refused:
            print(f"meshrun: a submission here would be refused: {v.refused}")
        if v.note:
            print(f"meshrun: {v.note}")
    else:
        print(f"\n# would run {spec.plan.world_size} local ranks: python -m train {spec.run_dir}")
    print("meshrun: dry run, nothing was started or submitted")


def typed_overrides() -> list[str]:
    """The command line's overrides as typed (for the run record)."""
    if not HydraConfig.initialized():
        return []
    return [str(o) for o in HydraConfig.get().overrides.task]


def submit_slurm(spec: RunSpec, overrides: list[str] | None = None, *, stage: str = "") -> int:
    """Submit one checked run to Slurm: its code snapshot, run dir and run record, then sbatch."""
    from launcher.slurm.cluster import slurm_reachable

    cfg = spec.cfg
    if cfg.cluster.login:
        # Never sbatch here for a cluster named by its login node: meshrun runs there (nothing written here).
        return _over_ssh(spec, typed_overrides() if overrides is None else overrides, stage)
    if not slurm_reachable():
        raise ConfigError(
            f"cluster={cfg.cluster.name} is a Slurm cluster but no Slurm is reachable from here "
            "(sbatch/squeue not found). Use cluster=local to run on this machine, or "
            "launcher.dry_run=true to see the plan and the sbatch script."
        )
    check_resume(spec)  # read-only: a changed config is refused before "already completed"
    done = finished_message(spec)
    if done:  # an allocation would only load the last checkpoint and exit
        print(f"meshrun: {done}")
        return 0
    typed = typed_overrides() if overrides is None else overrides
    sub = submit_runs([spec], [typed], stage=stage)  # launcher/run/submission.py: the one sequence
    job_id, snap, deps = sub.job_id, sub.snap, sub.after
    print(f"meshrun: submitted job {job_id}: {plan_layout_summary(spec.plan)}")
    print(f"meshrun: {describe(snap)}")
    if deps:
        waits = ", ".join(f"{d['job_id']} ({d['after']}, {d['state']})" for d in deps)
        print(f"meshrun: starts after job(s) {waits} succeed; cancelled by Slurm if one fails")
    print(f"meshrun: run dir {spec.run_dir}  (status: python -m launcher.status {spec.run_dir})")
    return 0


def _over_ssh(spec: RunSpec, overrides: list[str], stage: str) -> int:
    from launcher.entry.sshsubmit import submit_over_ssh
    from launcher.slurm.cluster import SlurmUnavailable
    from launcher.slurm.remote import RemoteError

    if stage:
        raise ConfigError(
            f"cluster.login={spec.cfg.cluster.login!r}: a pipeline stage goes to the login node with its "
            "whole pipeline (meshrun pipeline FILE), never alone"
        )
    try:
        return submit_over_ssh(spec, overrides)
    except RemoteError as e:
        raise SlurmUnavailable(str(e)) from e


def launch(cfg: RunConfig, run_dir: str, typed: list[str] | None = None) -> int:
    """Plan and act on one composed run; returns the process exit code. A
    run dir that holds a run continues it: its saved config, ``typed``
    (the command line's overrides by default) on top."""
    cfg = continued_config(cfg, run_dir, typed_overrides() if typed is None else typed)
    spec = prepare(cfg, run_dir)
    plan = spec.plan
    if cfg.launcher.dry_run:
        # Shown, not stored: a new run's id is given at its first real start.
        spec.run_id = read_run_id(spec.run_dir) or new_run_id(run_name(cfg))
        dry_run(spec)
        return 0
    if cfg.cluster.kind == "slurm":
        return submit_slurm(spec)
    # One owner per run dir, held until the ranks are gone (launcher/run/runlock.py).
    # The lock makes a new run dir; check_slurm_owner and check_resume can
    # refuse only an existing one.
    with own_run_dir(spec.run_dir):
        check_slurm_owner(spec.run_dir)  # a run dir submitted to Slurm: its job must have ended
        check_resume(spec)
        done = finished_message(spec)
        if done:  # said before anything is written or started
            print(f"meshrun: {done}")
            return 0
        try:
            write_run_dir(spec)
            write_record(spec, snapshot_run(spec), typed_overrides())
        except OSError as e:
            raise ConfigError(
                f"launcher.run_dir={spec.run_dir!r} cannot be written: {e.strerror or e}"
            ) from e
        print(f"meshrun: {plan_layout_summary(plan)}; run {spec.run_id} in {spec.run_dir}", flush=True)
        code = run_local(spec)
        # goodput.json at the run's end, as a Slurm job's teardown writes it.
        write_local_goodput(spec.run_dir)
    print_end(spec, code)
    return code


def print_end(spec: RunSpec, code: int) -> None:
    """How a local run ended, and the exact command that continues it (none
    when there is nothing to continue): its run dir alone, its saved config."""
    kind, run_dir = spec.cfg.job.kind, spec.run_dir
    try:
        r = json.loads((Path(run_dir) / RESULT_FILE).read_text())
    except (OSError, ValueError):
        r = {}
    r = r if isinstance(r, dict) else {}
    status = r.get("status")
    if code == 0 and status:
        if kind == "generate":
            print(f"meshrun: {status}: completions in {r.get('output')}")
        elif kind == "eval":
            print(f"meshrun: {status}: loss {r.get('final_loss')}; every result in {r.get('eval')}")
        else:  # a program may report no step or loss: said only when known
            known = [f"step {r['final_step']}"] if r.get("final_step") else []  # 0: none reported
            known += [f"loss {r['final_loss']}"] if r.get("final_loss") is not None else []
            print(f"meshrun: {status}{' at ' + ', '.join(known) if known else ''}")
    again = f"python -m launcher launcher.run_dir={shlex.quote(run_dir)}"
    if kind == "eval" or (status == "completed" and kind in ("script", "generate")):
        return  # nothing left to continue
    if status == "completed":
        more = max(int(r.get("final_step") or 0), spec.cfg.train.steps) * 2
        print(f"meshrun: to train further: {again} train.steps={more}")
    else:
        print(f"meshrun: to continue this run (its program and config): {again}")


def run_task(cfg: DictConfig, run_dir: str | None = None) -> int:
    """One composed run, start to end; every user error is one line and an
    exit code (2: refused input, 3: Slurm failed), never a traceback."""
    from launcher.slurm.cluster import SlurmError

    try:
        try:
            run_cfg = to_run_config(cfg)
        except OmegaConfBaseException as e:
            raise ConfigError(str(e).strip().splitlines()[0]) from e
        return launch(run_cfg, run_cfg.launcher.run_dir or run_dir or default_run_dir(run_cfg))
    except ConfigError as e:
        error(str(e))
        return 2
    except SubmissionFailed as e:
        error(f"submission failed: {e}")
        return 3
    except SlurmError as e:
        error(str(e))
        return 3
