"""goodput.json written by the batch script when its tasks end, and by
``meshrun status`` while a run runs, without anyone running ``meshrun fleet``.

    python -m launcher.selfheal job-end RUN_DIR RC   # the batch script's teardown

At the end of an allocation Slurm has not yet recorded its end (sacct still
says RUNNING), so the last start ends now, in the state the tasks' exit
status means: 0 COMPLETED and ``final``; the requeue codes (75, 76) PREEMPTED,
not final (the job runs again; ``meshrun fleet`` finalises a cancelled one
from sacct); any other FAILED and ``final``. Never fails the job: a problem
is said on stderr and the exit status is 0.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from launcher.config.runfiles import REQUEUE_EXIT_CODE, UNCOMMITTED_EXIT_CODE
from launcher.slurm import cluster
from launcher.views import goodput as gp
from launcher.views.runsummary import life_attempts, life_goodput, life_job_ids


def job_id_from_env(env: dict[str, str] | None = None) -> str | None:
    """This job's id as sacct names it (``<array>_<task>`` for array tasks)."""
    env = dict(os.environ) if env is None else env
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID") or None


def state_of(rc: int) -> str:
    """The state the tasks' exit status means for this start."""
    if rc == 0:
        return "COMPLETED"
    return "PREEMPTED" if rc in (REQUEUE_EXIT_CODE, UNCOMMITTED_EXIT_CODE) else "FAILED"


def finish(
    run_dir: str | Path,
    job_id: str,
    rc: int,
    *,
    now: float | None = None,
    rows: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """goodput.json at the end of this allocation, over every job of the run
    (an extension's end keeps the earlier jobs' GPU-seconds; ``rows``:
    sacct's, one call when None)."""
    now = time.time() if now is None else now
    ids = life_job_ids(run_dir, job_id)
    rows = cluster.accounting(ids) if rows is None else rows
    by_job = gp.attempts_from(rows)
    if not by_job.get(job_id):
        raise LookupError(f"sacct knows no job {job_id}")
    last = by_job[job_id][-1]
    if last.end is None:  # not yet recorded: the allocation ends now
        last.end = now
    last.state = state_of(rc)
    tries = life_attempts(ids, by_job)
    if tries[-1] is not last:  # an earlier job listed after this one: this one's end decides
        tries.remove(last)
        tries.append(last)
    g = gp.compute(run_dir, tries, now=now)
    g["job_ids"] = ids
    g["finalised_by"] = "batch script" if g["final"] else None
    gp.write(run_dir, g)
    return g


def refresh(runs: list[tuple[str, str]], now: float | None = None) -> dict[str, dict[str, Any]]:
    """Each (run_dir, job_id)'s goodput over the run's whole life (every job
    of its run dir) from ONE sacct call, written to its goodput.json unless
    a final one for those jobs is there (then read back); by run_dir. Runs
    sacct does not know are left out."""
    now = time.time() if now is None else now
    lives = {run_dir: life_job_ids(run_dir, job_id) for run_dir, job_id in runs}
    ids = sorted({j for life in lives.values() for j in life})
    by_job = gp.attempts_from(cluster.accounting(ids)) if ids else {}
    out: dict[str, dict[str, Any]] = {}
    for run_dir, life in lives.items():
        tries = life_attempts(life, by_job)
        if not tries:
            continue
        g, note = life_goodput(run_dir, life, tries, now)
        if note:
            print(f"meshrun: {run_dir}/{gp.GOODPUT_FILE}: {note}", file=sys.stderr)
        out[run_dir] = g
    return out


REFRESH_EVERY_S = 60.0  # the supervisor's goodput.json refresh: one sacct call a minute


def keep_fresh(run_dir: str, job_id: str, every_s: float = REFRESH_EVERY_S) -> threading.Event:
    """Refresh ``goodput.json`` every ``every_s`` while the job runs (the
    batch-level supervisor calls it, so rank 0's exporter serves current
    figures without anyone running ``meshrun status`` or ``meshrun fleet``).
    Set the returned event to stop. A failed refresh is said on stderr, once
    per cause, and tried again at the next interval."""
    stop = threading.Event()
    said: set[str] = set()

    def loop() -> None:
        while not stop.wait(every_s):
            try:
                refresh([(run_dir, job_id)])
            except (cluster.SlurmError, OSError) as e:
                if str(e) not in said:
                    said.add(str(e))
                    print(f"meshrun: goodput.json not refreshed: {e}", file=sys.stderr, flush=True)

    threading.Thread(target=loop, name="goodput-refresh", daemon=True).start()
    return stop


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 2 or not argv[1].lstrip("-").isdigit():
        print("usage: python -m launcher.selfheal job-end RUN_DIR RC", file=sys.stderr)
        return 2
    run_dir, rc = argv[0], int(argv[1])
    job_id = job_id_from_env()
    if not job_id:
        print("meshrun: goodput.json not written: no SLURM_JOB_ID (not inside a job)", file=sys.stderr)
        return 0
    try:
        g = finish(run_dir, job_id, rc)
    except (cluster.SlurmError, LookupError, OSError) as e:
        print(f"meshrun: {run_dir}/{gp.GOODPUT_FILE} not written at the job's end: {e}", file=sys.stderr)
        return 0
    ettr = "-" if g["ettr"] is None else f"{100 * g['ettr']:.1f}%"
    print(f"meshrun: goodput.json written (final={str(g['final']).lower()}, ETTR {ettr})")
    return 0
