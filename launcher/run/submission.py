"""The one Slurm submission sequence: the
CLI's single run (launcher/entry/launch.py), the API and pipelines through
it, and the Hydra sweep plugin's job arrays (hydra_plugins/meshrun_launcher)
all submit checked runs here.

The order is the contract: each run dir is claimed (the local runs' lock,
launcher/run/runlock.py) and its owner and resumability asked under the
claim; then everything Slurm can refuse (the request, ``launcher.after``);
then the code snapshot; only then are the run dirs and records written and
sbatch run. A refusal before sbatch takes back every file and directory
this submission made, in the run dirs, the sweep's slurm dir and the code
store, so it leaves nothing behind."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.config.spec import RunSpec
from launcher.run.codesnap import CodeSnapshot, StoreUndo, snapshot_run
from launcher.run.record import write_record
from launcher.run.rundir import check_resume, write_run_dir
from launcher.run.runlock import check_slurm_owner, claim_for_submission
from launcher.run.undo import RunDirUndo


class SubmissionFailed(RuntimeError):
    """Slurm did not take the job; the run dirs were removed (or restored)."""


@dataclass
class Submitted:
    job_id: str  # the job, or the job array (its points are <job_id>_<index>)
    snap: CodeSnapshot
    after: list[dict[str, Any]] = field(default_factory=list)  # launcher.after's jobs, resolved


def submit_runs(
    specs: Sequence[RunSpec],
    typed: Sequence[Sequence[str]],
    *,
    array_dir: Path | None = None,
    job_name: str = "",
    extra: dict[str, str] | None = None,
    stage: str = "",
    check: bool = True,
) -> Submitted:
    """Submit checked runs with one request (same resources, same code): one
    job when ``array_dir`` is None (a single run), else one job array whose
    Slurm files go to ``array_dir``. ``typed[i]`` is run i's overrides as
    typed, for its record. ``check=False`` skips asking the cluster about
    partition, QOS and account (the sweep plugin's ``check``). Raises ConfigError or SlurmError for a request
    refused before anything was written, SubmissionFailed when sbatch (or a
    write) failed after, each time with this submission's files taken back."""
    from launcher.slurm.cluster import SlurmError, check_request
    from launcher.slurm.depend import dependency_parameters, resolve_after
    from launcher.slurm.submit import submit_array, submit_run

    assert specs and len(specs) == len(typed), (len(specs), len(typed))
    assert array_dir is not None or len(specs) == 1, "several runs are one job array"
    store_undo = StoreUndo(specs[0].cfg)
    snap: CodeSnapshot | None = None
    with contextlib.ExitStack() as claims:
        undos: list[RunDirUndo] = [RunDirUndo(array_dir)] if array_dir is not None else []

        def undo_all() -> str:
            said = [u.undo() for u in reversed(undos)]
            store_undo.undo(snap)
            return "; ".join(s for s in said if s)

        try:
            for spec in specs:
                undos.append(claims.enter_context(claim_for_submission(spec.run_dir)))
                check_slurm_owner(spec.run_dir)
                check_resume(spec)
            if check:
                check_request(specs[0])  # the request is the same for every run here
            deps = resolve_after(specs[0].cfg)  # each must exist and not have failed
            # One snapshot for all (the store dedups by content): every run,
            # its requeues and restarts run the same code, whenever they start.
            snap = snapshot_run(specs[0])
        except BaseException:
            undo_all()
            raise
        try:
            for spec, overrides in zip(specs, typed, strict=True):
                write_run_dir(spec)
                write_record(spec, snap, list(overrides), stage=stage, after=deps)
            extra = {**(extra or {}), **dependency_parameters(deps)}
            # A script job's program runs from its packed project dir (snap.project_dir).
            if array_dir is None:
                job_id = submit_run(
                    specs[0],
                    check=False,
                    code_dir=snap.meshrun_dir,
                    extra=extra,
                    project_dir=snap.project_dir,
                )
            else:
                job_id = submit_array(
                    list(specs),
                    array_dir,
                    check=False,
                    job_name=job_name,
                    code_dir=snap.meshrun_dir,
                    extra=extra,
                    project_dir=snap.project_dir,
                )
        except (SlurmError, OSError) as e:
            said = undo_all()
            raise SubmissionFailed(f"{e}; {said} (nothing was submitted)") from e
    return Submitted(str(job_id), snap, deps)
