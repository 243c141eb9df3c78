"""Submit planned runs to Slurm through submitit, and return at once.

One run: :func:`submit_run`. Sweeps: :func:`submit_array` submits points
whose rendered scripts are identical but for the run directory as one job
array (each task picks its run dir by ``SLURM_ARRAY_TASK_ID``).

The script is launcher/slurm/render.py's, so the dry run shows exactly what is
submitted. Each run dir gets ``slurm/job.json`` (job id, array index) that
``python -m launcher.status`` reads.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from launcher.config import nodeledger, nodename
from launcher.config.runfiles import JOB_FILE, SLURM_DIR
from launcher.config.runid import new_run_id
from launcher.config.secrets import secret_env_names
from launcher.config.spec import RunSpec
from launcher.slurm.cluster import SlurmError, SlurmUnavailable, check_request, config_problem, one_line
from launcher.slurm.container import check_image
from launcher.slurm.render import array_parameters, submitit_parameters, supervised_command, task_command
from launcher.slurm.resources import node_mem_gb


def _submit(
    spec: RunSpec,
    folder: Path,
    command: str,
    params: dict[str, Any] | None = None,
    *,
    array: int = 0,
    job_name: str = "",
    code_dir: str | None = None,
) -> str:
    import submitit
    from submitit.core.utils import FailedJobError, FailedSubmissionError

    # Last guard before sbatch (launch() checks first, before the run dir is written).
    check_image(spec.cfg.cluster.container_image)
    if params is None:
        params = submitit_parameters(spec, str(folder), code_dir=code_dir)
    params = dict(params)
    if params.get("use_srun") is False:  # training: srun under launcher/selfheal/supervisor.py
        command = supervised_command(spec, str(folder), command, params["srun_args"], code_dir=code_dir)
    if job_name:
        params["job_name"] = job_name
    if "exclude" in params:  # the one way a node name reaches the script: each checked
        params["exclude"] = nodename.node_list(str(params["exclude"]).split(","))
    folder.mkdir(parents=True, exist_ok=True)
    ex = _executor(submitit.SlurmExecutor, folder)
    params.pop("mem")
    ex.update_parameters(**params)
    ex.parameters["mem"] = f"{node_mem_gb(spec)}GB"
    if array:
        ex.parameters["map_count"] = array
        ex.parameters["array_parallelism"] = array
    problem = config_problem()
    if problem:  # sbatch would retry for 60 s first
        raise SlurmUnavailable(problem)
    try:
        # submitit writes the script, runs sbatch, parses the id; it prints
        # sbatch's stderr itself on failure: kept for our one-line error.
        with contextlib.redirect_stderr(io.StringIO()):
            job = ex._submit_command(command)
    except (FailedJobError, FailedSubmissionError, OSError, subprocess.CalledProcessError) as e:
        raise SlurmError(f"sbatch refused the job: {one_line(str(e))}") from e
    return str(job.job_id)


def _executor(base: Any, folder: Path) -> Any:
    """submitit's executor whose sbatch runs without the credentials of this
    environment: sbatch stores the environment it is given in the
    controller's state (and accounting's, with job_env), and every task
    inherits it. Jobs read S3 keys from a file or a role (docs/security.md)."""
    drop = secret_env_names(os.environ)
    if drop:
        print(
            f"meshrun: not passed to Slurm (credentials): {', '.join(drop)}; jobs read S3 keys from "
            "storage.s3_credentials_file or a role (storage.s3_credentials=role)"
        )

    class Executor(base):  # type: ignore[misc, valid-type]
        def _make_submission_command(self, submission_file_path: Path) -> list[str]:
            # env(1) removes them (names only on its argv); sbatch's argv is unchanged.
            return [
                "env",
                *(f"--unset={k}" for k in drop),
                *super()._make_submission_command(submission_file_path),
            ]

    return Executor(folder=folder)


def _write_job_file(
    run_dir: str, job_id: str, array_index: int | None = None, excluded: dict[str, str] | None = None
) -> None:
    """``slurm/job.json``: the newest job (``job_id``, what older readers read)
    and every job the run dir ever had (``jobs``, oldest first): a continuation
    (a later job in the same run dir) adds to the run's history, never replaces it."""
    path = Path(run_dir) / SLURM_DIR / JOB_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    job = job_id if array_index is None else f"{job_id}_{array_index}"
    now = time.time()
    history = [j for j in read_jobs(run_dir) if j["job_id"] != job]
    rec: dict[str, Any] = {"job_id": job, "submitted_at": now}
    if excluded:
        rec["excluded_nodes"] = excluded
    rec["jobs"] = [*history, {"job_id": job, "submitted_at": now}]
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(rec) + "\n")
    os.replace(tmp, path)  # a reader never sees half a record


def excluded_nodes(spec: RunSpec) -> dict[str, str]:
    """Nodes the bad-node ledger says to avoid: node -> why (its faults).
    Only valid node names (nodeledger.read skips, and says, any other line)."""
    lc = spec.cfg.launcher
    path = nodeledger.ledger_path(spec.cfg)
    bad = nodeledger.bad_nodes(nodeledger.read(path), lc.bad_node_faults, lc.bad_node_window_h)
    return {
        node: f"{nodeledger.describe(node, recs)} in the last {lc.bad_node_window_h:g} h ({path})"
        for node, recs in bad.items()
    }


def run_parameters(
    spec: RunSpec, folder: Path, code_dir: str | None = None, project_dir: str | None = None
) -> tuple[dict[str, Any], dict[str, str]]:
    """(submitit's parameters, the ledger's excluded nodes -> why) for one run."""
    params = submitit_parameters(spec, str(folder), code_dir=code_dir, project_dir=project_dir)
    excluded = excluded_nodes(spec)
    if excluded:
        params["exclude"] = nodename.node_list(excluded)
    return params, excluded


def read_jobs(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every job of the run dir, oldest first (``{"job_id", "submitted_at"}``);
    a job.json from before the history was kept gives its one job."""
    try:
        data = json.loads((Path(run_dir) / SLURM_DIR / JOB_FILE).read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(data, dict) or not data.get("job_id"):
        return []
    jobs = [
        {"job_id": str(j["job_id"]), "submitted_at": j.get("submitted_at")}
        for j in data.get("jobs") or []
        if isinstance(j, dict) and j.get("job_id")
    ]
    if not any(j["job_id"] == str(data["job_id"]) for j in jobs):
        jobs.append({"job_id": str(data["job_id"]), "submitted_at": data.get("submitted_at")})
    return jobs


def read_job_ids(run_dir: str | Path) -> list[str]:
    """The run's job ids over its life, oldest first (the first, extensions...)."""
    return [j["job_id"] for j in read_jobs(run_dir)]


def read_job_id(run_dir: str | Path) -> str | None:
    """The run's newest job id, None before any submission."""
    ids = read_job_ids(run_dir)
    return ids[-1] if ids else None


def submit_run(
    spec: RunSpec,
    *,
    check: bool = True,
    code_dir: str | None = None,
    extra: dict[str, str] | None = None,
    project_dir: str | None = None,
) -> str:
    """Check the request against the cluster, submit, return the job id.
    ``code_dir``: the meshrun code the job runs (a code snapshot,
    launcher/run/codesnap.py; default the live checkout); ``project_dir``:
    a script job's packed project dir (its program runs from there)."""
    if check:
        check_request(spec)
    folder = Path(spec.run_dir) / "slurm"
    # job=generate with job.array_tasks=N: N array tasks of the same run dir
    # split the prompts (train/jobs/generate.py reads SLURM_ARRAY_TASK_ID/COUNT).
    j = spec.cfg.job
    tasks = j.array_tasks if j.kind == "generate" and j.array_tasks > 1 else 0
    params, excluded = run_parameters(spec, folder, code_dir=code_dir, project_dir=project_dir)
    # launcher.after: --dependency=afterok:... (launcher/slurm/depend.py)
    params["additional_parameters"].update(extra or {})
    for why in excluded.values():
        print(f"meshrun: excluding {why}")
    job_id = _submit(spec, folder, task_command(spec), params, array=tasks, code_dir=code_dir)
    _write_job_file(spec.run_dir, job_id, excluded=excluded)
    return job_id


def array_key(spec: RunSpec) -> str:
    """Points with the same key share one job array: their scripts differ
    only in the run directory."""
    from launcher.slurm.render import render_sbatch

    # job=script: one packed project dir per array, so points share it only with the same job.workdir.
    project = spec.cfg.job.workdir if spec.cfg.job.kind == "script" else None
    script = render_sbatch(spec, "@FOLDER@", python="@PY@", code_dir="@CODE@", project_dir=project)
    script = script.replace(spec.run_dir, "@RUN_DIR@")
    return script.replace(spec.run_id, "@RUN_ID@") if spec.run_id else script


def submit_array(
    specs: list[RunSpec],
    folder: Path,
    *,
    check: bool = True,
    job_name: str = "",
    code_dir: str | None = None,
    extra: dict[str, str] | None = None,
    project_dir: str | None = None,
) -> str:
    """Submit same-resource runs as one job array; returns the array job id.
    Task i trains ``specs[i].run_dir`` (each its own run id); the array's job
    name is ``job_name`` (the sweep's id), one name for all its tasks."""
    assert specs and len({array_key(s) for s in specs}) == 1, "array points must share resources"
    if check:
        check_request(specs[0])
    command, params = array_parameters(specs, str(folder), code_dir=code_dir, project_dir=project_dir)
    params["additional_parameters"].update(extra or {})
    job_id = _submit(
        specs[0],
        folder,
        command,
        params,
        array=len(specs),
        job_name=job_name or new_run_id("sweep"),
        code_dir=code_dir,
    )
    for i, s in enumerate(specs):
        _write_job_file(s.run_dir, job_id, i)
    return job_id
