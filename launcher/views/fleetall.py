"""``meshrun fleet --all-users``: every meshrun job Slurm knows, not only
those under the runs root, from ONE ``sacct -a`` and ONE ``squeue -a`` call
per refresh (cached like :class:`launcher.views.fleetrows.Scheduler`).

A job is meshrun's when its comment is the one the batch script carries
(``meshrun run_dir=<dir>``, launcher/slurm/render.py; squeue always has it,
sacct only with AccountingStoreFlags=job_comment) or its submit line is
sbatch of a submitit script in ``<run_dir>/slurm/``. Jobs not under the runs
root are shown by what Slurm knows: job name, user, QOS, partition, state,
GPUs, elapsed GPU-hours (allocated: every start's elapsed time x its GPUs),
Slurm's reason and expected start when pending. sacct looks back
:data:`ALL_USERS_DAYS` days, or to the oldest run under the root.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from launcher.config.runfiles import SPEC_FILE
from launcher.slurm import cluster
from launcher.views import fleetrows as fleet
from launcher.views import goodput as gp

ALL_USERS_DAYS = 7.0
COMMENT_PREFIX = "meshrun run_dir="
_SUBMISSION = re.compile(r"^sbatch (?:.* )?(/\S+)/slurm/\.submission_file_[0-9a-f]+\.sh$")


def run_dir_hint(comment: str, submit_line: str) -> str | None:
    """The run (or sweep) dir a meshrun job names; None when the job is not meshrun's."""
    if comment.startswith(COMMENT_PREFIX):
        return comment[len(COMMENT_PREFIX) :]
    m = _SUBMISSION.match(submit_line.strip())
    return m.group(1) if m else None


class AllUsersScheduler(fleet.Scheduler):
    """Every user's jobs: one sacct -a (since :attr:`since_s`) and one squeue -a per refresh."""

    def __init__(self, min_interval_s: float = fleet.MIN_REFRESH_S) -> None:
        super().__init__(min_interval_s)
        self.since_s = time.time() - ALL_USERS_DAYS * 86400

    def fetch(self, job_ids: list[str]) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
        if time.monotonic() - self._at < self.min_interval_s:
            return self._acct, self._queue
        self.error = None
        since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self.since_s))
        try:
            self._acct = cluster.accounting_all_users(since)
            self._queue = cluster.queue_all_users()
            self.calls += 2
        except cluster.SlurmError as e:
            self.error = str(e)
            self._acct, self._queue = [], []
        self._at = time.monotonic()
        return self._acct, self._queue


def other_rows(
    acct: list[dict[str, str]], queue: list[dict[str, str]], known: set[str], now: float
) -> list[fleet.RunRow]:
    """A row per meshrun job Slurm knows whose id is not in ``known``."""
    live = {q["JobID"]: q for q in queue}
    names = {r["JobID"]: r for r in acct}
    hints: dict[str, str] = {}
    for jid, r in names.items():
        hint = run_dir_hint(r.get("Comment", ""), r.get("SubmitLine", ""))
        if hint is not None:
            hints[jid] = hint
    for jid, q in live.items():
        hint = run_dir_hint(q.get("Comment", ""), "")
        if hint is not None:
            hints.setdefault(jid, hint)
    attempts = gp.attempts_from(acct)
    rows = []
    for jid, hint in sorted(hints.items(), key=lambda kv: _job_key(kv[0])):
        if jid in known:
            continue
        tries = attempts.get(jid, [])
        last = tries[-1] if tries else None
        q = live.get(jid, {})
        gpu_s = sum(((a.end or now) - a.start) * a.gpus for a in tries if a.start is not None)
        row = fleet.RunRow(
            run=names.get(jid, {}).get("JobName") or q.get("Name", "") or jid,
            run_dir=hint,
            sweep="",
            point="",
            job_id=jid,
            state=q.get("State") or (last.state if last else "UNKNOWN"),
            user=(last.user if last else "") or q.get("UserName", ""),
            qos=(last.qos if last else "") or q.get("QOS", ""),
            partition=(last.partition if last else "") or q.get("Partition", ""),
            account=last.account if last else "",
            gpus=(last.gpus if last else 0)
            or gp.gpus_of(q.get("NumGPUs", "").replace("gres:gpu:", "gres/gpu=")),
            gpu_hours=gpu_s / 3600.0,
        )
        if row.state == "PENDING":
            row.reason = q.get("Reason") or (last.reason if last else "")
            row.expected_start = gp._epoch(q.get("StartTime", ""))
        rows.append(row)
    return rows


def _job_key(job_id: str) -> tuple[int, str]:
    m = re.match(r"\d+", job_id)
    return (int(m.group()) if m else 0, job_id)


def collect_all(
    root: str | Path,
    scheduler: AllUsersScheduler,
    *,
    budget_usd: float | None = None,
    write: bool = True,
    now: float | None = None,
) -> fleet.FleetView:
    """:func:`launcher.views.fleetrows.collect` plus every other meshrun job Slurm
    knows (``view.others``); totals per user / QOS / partition over both."""
    now = time.time() if now is None else now
    mtimes = [
        (Path(r.run_dir) / SPEC_FILE).stat().st_mtime
        for r in fleet.find_runs(root)
        if (Path(r.run_dir) / SPEC_FILE).exists()
    ]
    scheduler.since_s = min([now - ALL_USERS_DAYS * 86400, *(m - 86400 for m in mtimes)])
    view = fleet.collect(root, scheduler, budget_usd=budget_usd, write=write, now=now)
    known = {r.job_id for r in view.runs if r.job_id}
    view.others = other_rows(scheduler._acct, scheduler._queue, known, now)
    view.totals = fleet.totals(view.runs + view.others)
    return view
