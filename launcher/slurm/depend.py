"""Runs that wait for others: ``launcher.after=<run dir or job id>[,...]``.

Each item is a run dir (its Slurm job from ``slurm/job.json``) or a job id.
The job is submitted with ``--dependency=afterok:<id>:...`` and
``--kill-on-invalid-dep=yes``: when a job it waits for fails, Slurm cancels
it instead of leaving it pending forever (``meshrun status`` then says which
dependency failed). Checked before anything is written: a dependency that
does not exist or has already failed is refused.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from launcher.config.runfiles import JOB_FILE
from launcher.config.schema import RunConfig
from launcher.config.validate import fail
from launcher.slurm.cluster import jobs, run

JOB_ID = re.compile(r"^\d+(_\d+)?$")
RUN_DIR_COMMENT = "meshrun run_dir="  # the comment of a run's job (launcher/slurm/render.py)
FAILED = {
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "OUT_OF_MEMORY",
    "NODE_FAIL",
    "BOOT_FAIL",
    "DEADLINE",
    "PREEMPTED",
}


def after_items(cfg: RunConfig) -> list[str]:
    """The items of ``launcher.after`` (comma or space separated)."""
    return [x for x in re.split(r"[,\s]+", cfg.launcher.after.strip()) if x]


def _job_of(item: str) -> str:
    if JOB_ID.match(item):
        return item
    path = Path(item)
    job_file = path / "slurm" / JOB_FILE
    if not path.is_dir():
        raise fail("launcher.after", item, "not a job id and no such run dir")
    try:
        return str(json.loads(job_file.read_text())["job_id"])
    except (OSError, ValueError, KeyError) as e:
        raise fail("launcher.after", item, f"the run dir has no Slurm job ({job_file} unreadable)") from e


def _states(ids: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """Each job's state (squeue for queued and running ones, sacct for the
    rest), and the run dir of each queued meshrun job (its comment)."""
    out: dict[str, str] = {}
    dirs: dict[str, str] = {}
    live = run(["squeue", "-h", "-j", ",".join(ids), "-o", "%i|%T|%k"], check=False)
    for line in live.stdout.splitlines():
        parts = line.split("|", 2)
        if len(parts) == 3 and parts[0] in ids:
            out[parts[0]] = parts[1]
            if parts[2].startswith(RUN_DIR_COMMENT):
                dirs[parts[0]] = parts[2][len(RUN_DIR_COMMENT) :]
    rest = [i for i in ids if i not in out]
    for jid, rec in jobs(rest).items() if rest else []:
        if jid in rest:
            out[jid] = rec.state
    return out, dirs


def resolve_after(cfg: RunConfig) -> list[dict[str, Any]]:
    """``[{"after": item, "job_id", "state", "run_dir"?}]``; ConfigError for a
    dependency that does not exist or already failed."""
    items = after_items(cfg)
    if not items:
        return []
    resolved = [{"after": item, "job_id": _job_of(item)} for item in items]
    for r in resolved:
        if not JOB_ID.match(r["after"]):
            r["run_dir"] = str(Path(r["after"]).resolve())
    states, dirs = _states([r["job_id"] for r in resolved])
    for r in resolved:
        if "run_dir" not in r and r["job_id"] in dirs:
            r["run_dir"] = dirs[r["job_id"]]  # so status can name the run behind a bare job id
        state = states.get(r["job_id"])
        if state is None:
            raise fail("launcher.after", r["after"], f"Slurm knows no job {r['job_id']}")
        if state in FAILED:
            raise fail(
                "launcher.after",
                r["after"],
                f"job {r['job_id']} has already ended {state}: a run after it would never start",
            )
        r["state"] = state
    return resolved


def dependency_parameters(resolved: list[dict[str, Any]]) -> dict[str, str]:
    """sbatch's extra parameters for these dependencies (submitit's names)."""
    if not resolved:
        return {}
    return {
        "dependency": "afterok:" + ":".join(r["job_id"] for r in resolved),
        "kill-on-invalid-dep": "yes",
    }
