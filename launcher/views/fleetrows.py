"""Every run and sweep under a runs root in one view (``meshrun fleet``).

Per run: state, step / steps, tokens, last loss, tokens/s, GPU-hours, cost to
date and projected cost at completion (the cluster preset's on-demand node
price, launcher/perf/pricing.py's table), ETTR and restarts (goodput,
:mod:`launcher.views.goodput`), faults (``<run_dir>/faults.jsonl``). Totals per
user, per QOS and per partition against the QOS preset's share of the
cluster (conf/qos ``cluster_share_pct``). Pending jobs with Slurm's reason and
expected start.

Cheap on the scheduler: ONE ``sacct`` call per refresh for all jobs, and one
``squeue`` only when a job is pending; answers are cached for at least
:data:`MIN_REFRESH_S` (:class:`Scheduler`), so ``--watch`` and the web page
(``--serve``) cannot poll Slurm faster than that.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from launcher.config import nodeledger
from launcher.config.runfiles import MANIFEST_FILE, PIPELINE_FILE, SPEC_FILE
from launcher.config.runid import read_run_id
from launcher.config.schema import LauncherConfig
from launcher.config.scriptjob import last_step_record
from launcher.slurm import cluster
from launcher.slurm.submit import read_job_id
from launcher.views import goodput as gp
from launcher.views.runforecast import run_forecast
from launcher.views.runsummary import life_attempts, life_job_ids, point_name, summarize

MIN_REFRESH_S = 10.0  # the fastest a refresh may ask Slurm again
MANIFEST = MANIFEST_FILE
CONF = Path(__file__).resolve().parents[2] / "conf"
# Directories inside a run dir never holding another run.
SKIP_DIRS = {"checkpoints", "slurm", "tensorboard", "wandb", "prometheus", "hf", ".git", "__pycache__"}


@dataclass
class RunRef:
    run_dir: str
    job_id: str | None
    sweep: str = ""
    point: str = ""
    pipeline: str = ""  # the pipeline dir's name (its pipeline.json lists this run as a stage)
    stage: str = ""
    stage_index: int = 0  # the stage's place in pipeline.json (the walk's order is the dirs')


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError, NotADirectoryError):
        return None


def find_runs(root: str | Path) -> list[RunRef]:
    """Every run dir (spec.json) under ``root``; sweep points carry their
    sweep (the parent's manifest.json) and their job id from it when the run
    dir has no slurm/job.json."""
    root = Path(root)
    refs: list[RunRef] = []
    point_jobs: dict[str, tuple[str, str, str | None]] = {}
    stages: dict[str, tuple[str, str, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        if PIPELINE_FILE in filenames and SPEC_FILE not in filenames:
            data = _json(Path(dirpath) / PIPELINE_FILE)
            for i, s in enumerate(data.get("stages", []) if isinstance(data, dict) else []):
                if isinstance(s, dict) and s.get("run_dir") and s.get("stage"):
                    stages[str(Path(s["run_dir"]).resolve())] = (Path(dirpath).name, str(s["stage"]), i)
        if MANIFEST in filenames and SPEC_FILE not in filenames:
            data = _json(Path(dirpath) / MANIFEST)
            if isinstance(data, dict) and isinstance(data.get("points"), list):
                for i, p in enumerate(data["points"]):
                    if isinstance(p, dict) and p.get("run_dir"):
                        rd = str(Path(p["run_dir"]).resolve())
                        point_jobs[rd] = (
                            Path(dirpath).name,
                            point_name(p, i, data["points"]),
                            p.get("job_id"),
                        )
        if SPEC_FILE in filenames:
            refs.append(RunRef(str(Path(dirpath).resolve()), read_job_id(dirpath)))
            dirnames[:] = []  # a run dir holds no other run
            continue
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
    for r in refs:
        if r.run_dir in point_jobs:
            r.sweep, r.point, job = point_jobs[r.run_dir]
            r.job_id = r.job_id or (str(job) if job else None)
        r.pipeline, r.stage, r.stage_index = stages.get(r.run_dir, ("", "", 0))
    return refs


def pipelines(refs: list[RunRef], rows: list[RunRow]) -> list[dict[str, Any]]:
    """One entry per pipeline under the root: its stages in the file's order,
    each with its run, state and step (the fleet's one row for a pipeline)."""
    out: dict[str, dict[str, Any]] = {}
    pairs = sorted(zip(refs, rows, strict=True), key=lambda p: (p[0].pipeline, p[0].stage_index))
    for ref, row in pairs:
        if ref.pipeline:
            entry = out.setdefault(ref.pipeline, {"pipeline": ref.pipeline, "stages": []})
            entry["stages"].append({"stage": ref.stage, "run": row.run, "state": row.state, "step": row.step})
    return list(out.values())


class Scheduler:
    """Slurm's answers for the fleet, one ``sacct`` (+ one ``squeue`` when
    a job is pending) per refresh, reused for ``min_interval_s``."""

    def __init__(self, min_interval_s: float = MIN_REFRESH_S) -> None:
        self.min_interval_s = max(MIN_REFRESH_S, min_interval_s)
        self.calls = 0
        self._at = -1e18
        self._ids: tuple[str, ...] = ()
        self._acct: list[dict[str, str]] = []
        self._queue: list[dict[str, str]] = []
        self.error: str | None = None

    def fetch(self, job_ids: list[str]) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
        ids = tuple(sorted(set(job_ids)))
        fresh = time.monotonic() - self._at < self.min_interval_s
        if fresh and set(ids) <= set(self._ids):
            return self._acct, self._queue
        self.error = None
        try:
            self._acct = cluster.accounting(list(ids)) if ids else []
            self.calls += 1 if ids else 0
            if any(r.get("State", "").startswith("PENDING") for r in self._acct):
                self._queue = cluster.queue()
                self.calls += 1
            else:
                self._queue = []
        except cluster.SlurmError as e:
            # Said in the view and the table (never silent), local runs still shown.
            self.error = str(e)
            self._acct, self._queue = [], []
        self._ids, self._at = ids, time.monotonic()
        return self._acct, self._queue


def _tail_metrics(run_dir: Path) -> dict[str, Any]:
    """The last step record of metrics.jsonl (reads only the file's end)."""
    return last_step_record(run_dir / gp.METRICS_FILE)


_PRESETS: dict[tuple[str, str], dict[str, Any]] = {}


def preset(group: str, name: str) -> dict[str, Any]:
    """conf/<group>/<name>.yaml (cached), {} when there is none."""
    key = (group, name)
    if key not in _PRESETS:
        import yaml

        path = CONF / group / f"{name}.yaml"
        try:
            _PRESETS[key] = yaml.safe_load(path.read_text()) or {} if path.is_file() else {}
        except (OSError, yaml.YAMLError):
            _PRESETS[key] = {}
    return _PRESETS[key]


@dataclass
class RunRow:
    run: str
    run_dir: str
    sweep: str
    point: str
    job_id: str | None
    state: str
    model: str = ""  # model.name ("" for job=script: its program is the run)
    cluster: str = ""  # cluster.name
    program: str = ""  # a script's name and arguments, else job.kind (pretrain, eval, ...)
    user: str = ""
    qos: str = ""
    partition: str = ""
    account: str = ""
    # Unknown figures are None ("-" on screen), never 0.
    step: int | None = None
    steps: int | None = None  # steps to do: train.steps, or a script's job.total_steps
    tokens: float | None = None
    loss: float | None = None
    tokens_per_s: float | None = None
    gpus: int = 0
    gpu_hours: float | None = None
    cost_usd: float | None = None  # None: no price
    projected_usd: float | None = None
    ettr: float | None = None
    restarts: int | None = None
    faults: int = 0
    redone: int | None = None  # steps run again after a failure or a preemption
    job_ids: list[str] = field(default_factory=list)  # every job of the run, oldest first
    reason: str = ""
    expected_start: float | None = None
    # A running run's projected finish, hours from its start (launcher/views/runforecast.py).
    finish_p50_h: float | None = None
    finish_p90_h: float | None = None
    finish: str = ""  # "P50 / P90" for the text and the web page
    goodput: dict[str, Any] | None = field(default=None, repr=False)


def run_row(
    ref: RunRef,
    by_job: dict[str, list[gp.Attempt]],
    queue: dict[str, dict[str, str]],
    now: float,
    write: bool,
    cache: dict | None = None,
) -> RunRow:
    """A run's row: every figure from its one record (launcher/views/runsummary.py),
    the same status, the page and the API show; ``by_job``: sacct's starts by job id."""
    run_dir = Path(ref.run_dir)
    spec = _json(run_dir / SPEC_FILE) or {}
    cfg = spec.get("cfg", {}) if isinstance(spec, dict) else {}
    clus, qos = cfg.get("cluster", {}), cfg.get("qos", {})
    s = summarize(run_dir, by_job, job_id=ref.job_id, now=now, write=write, cache=cache)
    row = RunRow(
        # The run's one name, its id (the RUN DIR is beside it); a sweep point by its swept values.
        run=(read_run_id(run_dir) or run_dir.name) if not ref.sweep else f"{ref.sweep}/{ref.point}",
        run_dir=ref.run_dir,
        sweep=ref.sweep,
        point=ref.point,
        job_id=s.job_id,
        state=s.state,
        model=s.model or "",
        cluster=str(clus.get("name", "")),
        program=s.program,
        qos=qos.get("qos", ""),
        partition=qos.get("partition", ""),
        account=qos.get("account", ""),
        step=s.last_step,
        steps=s.total_steps,
        tokens=s.tokens,
        loss=s.loss,
        tokens_per_s=s.tokens_per_s,
        gpus=s.gpus,
        gpu_hours=None if s.gpu_s is None else s.gpu_s / 3600.0,
        ettr=s.ettr,
        restarts=s.restarts,
        faults=s.faults,
        redone=s.redone_steps,
        job_ids=s.job_ids,
        goodput=s.goodput,
        reason=s.note,
    )
    tries = life_attempts(s.job_ids, by_job)
    if not tries:
        return row
    a = tries[-1]
    row.user = a.user
    row.qos, row.partition, row.account = (
        a.qos or row.qos,
        a.partition or row.partition,
        a.account or row.account,
    )
    row.gpus = a.gpus or row.gpus
    _cost(row, s.goodput or {}, a.nodes, float(clus.get("price_on_demand_usd_per_node_hour") or 0.0))
    q = queue.get(a.job_id)
    if a.state == "PENDING":
        row.reason = (q or {}).get("Reason") or a.reason
        row.expected_start = gp._epoch((q or {}).get("StartTime", ""))
    return row


def _cost(row: RunRow, g: dict[str, Any], nodes: int, price: float) -> None:
    """Cost to date and projected at completion: None without a price (or steps to do)."""
    if price <= 0 or not g:
        return
    node_hours = sum((x["end"] - x["start"]) for x in g["segments"]) / 3600.0 * max(1, nodes)
    row.cost_usd = node_hours * price
    reached = g["steps"]["reached"]
    if row.state in gp.ENDED:
        row.projected_usd = row.cost_usd
    elif row.steps and reached:
        per_step_h = node_hours / reached  # badput included, as it has been so far
        row.projected_usd = row.cost_usd + max(0, row.steps - reached) * per_step_h * price


@dataclass
class FleetView:
    root: str
    updated: float
    runs: list[RunRow]
    totals: dict[str, list[dict[str, Any]]]
    budget: dict[str, float] | None
    scheduler_calls: int
    scheduler_error: str | None
    # <root>/bad_nodes.jsonl (launcher/config/nodeledger.py): node, faults,
    # causes, excluded (at the launcher.bad_node_* defaults).
    bad_nodes: list[dict[str, Any]] = field(default_factory=list)
    # --all-users (launcher/views/fleetall.py): meshrun jobs of anyone, not under root.
    others: list[RunRow] = field(default_factory=list)
    # meshrun pipeline dirs under root: [{"pipeline", "stages": [{"stage", "run", "state", "step"}]}].
    pipelines: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for r in d["runs"]:
            g = r.pop("goodput")
            r["goodput"] = (
                {
                    k: g[k]
                    for k in ("buckets_s", "buckets_gpu_s", "allocated_s", "allocated_gpu_s", "queue_wait_s")
                    + ("steps", "final")
                }
                if g
                else None
            )
        return d


def _per_day(runs: list[RunRow]) -> dict[str, dict[str, float]]:
    """GPU-hours per UTC day per account (allocations split at midnight)."""
    out: dict[str, dict[str, float]] = {}
    for r in runs:
        for s in (r.goodput or {}).get("segments", []):
            t, end = float(s["start"]), float(s["end"])
            while t < end:
                day = time.strftime("%Y-%m-%d", time.gmtime(t))
                next_day = (int(t) // 86400 + 1) * 86400
                chunk = min(end, next_day) - t
                acc = out.setdefault(day, {})
                acc[r.account or "-"] = acc.get(r.account or "-", 0.0) + chunk * s["gpus"] / 3600.0
                t = min(end, next_day)
    return dict(sorted(out.items()))


def cluster_gpus(c: dict[str, Any]) -> int:
    """GPUs of the whole cluster a run's cluster block names, as
    launcher.plan.qosshare.cluster_gpus counts them (cluster_nodes, or nodes when
    0), from its preset in conf/cluster (a run may have asked for fewer GPUs
    per node than its nodes have), else from the run's own block."""
    p = preset("cluster", str(c.get("name", ""))) if c.get("name") else {}
    for src in (p, c):
        nodes = max(int(src.get("cluster_nodes", 0) or 0), int(src.get("nodes", 0) or 0))
        if nodes and src.get("gpus_per_node"):
            return nodes * int(src["gpus_per_node"])
    return 0


def totals(runs: list[RunRow]) -> dict[str, list[dict[str, Any]]]:
    """GPU-hours, cost and GPUs in use now per user / QOS / partition; for a
    QOS, its preset's share of the cluster (conf/qos cluster_share_pct of the
    cluster preset's nodes x GPUs) and the share in use now."""
    out: dict[str, list[dict[str, Any]]] = {}
    for key in ("user", "qos", "partition"):
        groups: dict[str, dict[str, Any]] = {}
        for r in runs:
            name = getattr(r, key) or "-"
            g = groups.setdefault(
                name, {key: name, "runs": 0, "gpu_hours": 0.0, "cost_usd": 0.0, "gpus_now": 0, "pending": 0}
            )
            g["runs"] += 1
            g["gpu_hours"] += r.gpu_hours or 0.0
            g["cost_usd"] += r.cost_usd or 0.0
            g["gpus_now"] += r.gpus if r.state == "RUNNING" else 0
            g["pending"] += r.state == "PENDING"
        if key == "qos":
            for name, g in groups.items():
                share = preset("qos", name).get("cluster_share_pct")
                runs_q = [r for r in runs if r.qos == name]
                clus = _json(Path(runs_q[0].run_dir) / SPEC_FILE) if runs_q else None
                c = (clus or {}).get("cfg", {}).get("cluster", {})
                total = cluster_gpus(c)
                g["share_pct"] = share
                # Slurm's GrpTRES as qos-admin renders it (launcher.plan.qosshare.gpu_share).
                g["share_gpus"] = (
                    max(1, math.floor(total * share / 100)) if share is not None and total else None
                )
                g["in_use_pct"] = 100.0 * g["gpus_now"] / g["share_gpus"] if g.get("share_gpus") else None
        out[key] = sorted(groups.values(), key=lambda g: -g["gpu_hours"])
    out["per_day"] = [{"day": d, **acc} for d, acc in _per_day(runs).items()]
    return out


def collect(
    root: str | Path,
    scheduler: Scheduler | None = None,
    *,
    budget_usd: float | None = None,
    write: bool = True,
    now: float | None = None,
    cache: dict | None = None,
) -> FleetView:
    """The fleet under ``root``; writes each Slurm run's goodput.json (unless
    ``write`` is false; ``cache`` keeps final ones in memory instead)."""
    scheduler = scheduler or Scheduler()
    refs = find_runs(root)
    rows_acct, rows_queue = scheduler.fetch(
        sorted({j for r in refs for j in life_job_ids(r.run_dir, r.job_id)})
    )
    now = time.time() if now is None else now
    attempts = gp.attempts_from(rows_acct)
    queue = {q["JobID"]: q for q in rows_queue}
    runs = [run_row(ref, attempts, queue, now, write, cache) for ref in refs]
    for r in runs:
        if r.state == "RUNNING" and (f := run_forecast(r.run_dir, running=True)) is not None:
            r.finish_p50_h, r.finish_p90_h, r.finish = f.p50_h, f.p90_h, f.span()
    budget = None
    source = "--budget-usd"
    if budget_usd is None:
        budget_usd, source = config_budget(refs)
    if budget_usd is not None:
        spent = sum(r.cost_usd or 0.0 for r in runs)
        projected = sum(r.projected_usd if r.projected_usd is not None else (r.cost_usd or 0.0) for r in runs)
        budget = {
            "source": source,
            "budget_usd": budget_usd,
            "spent_usd": spent,
            "left_usd": budget_usd - spent,
            "projected_usd": projected,
        }
    return FleetView(
        str(root),
        now,
        runs,
        totals(runs),
        budget,
        scheduler.calls,
        scheduler.error,
        node_ledger(Path(root), now),
        pipelines=pipelines(refs, runs),
    )


def config_budget(refs: list[RunRef]) -> tuple[float | None, str]:
    """``launcher.budget_usd`` of the newest run (spec.json written last) that
    sets one (> 0), and where it came from; (None, "") when none does."""
    newest: tuple[float, float, str] | None = None
    for r in refs:
        path = Path(r.run_dir) / SPEC_FILE
        spec = _json(path)
        value = (
            (spec or {}).get("cfg", {}).get("launcher", {}).get("budget_usd")
            if isinstance(spec, dict)
            else None
        )
        if isinstance(value, int | float) and value > 0:
            mtime = path.stat().st_mtime
            if newest is None or mtime > newest[0]:
                newest = (mtime, float(value), r.run_dir)
    if newest is None:
        return None, ""
    return newest[1], f"launcher.budget_usd of {newest[2]}"


def node_ledger(root: Path, now: float) -> list[dict[str, Any]]:
    """The runs root's bad-node ledger, node by node (empty when there is none)."""
    recs = nodeledger.read(root / nodeledger.LEDGER_FILE)
    if not recs:
        return []
    d = LauncherConfig()
    excluded = nodeledger.bad_nodes(recs, d.bad_node_faults, d.bad_node_window_h, now)
    by_node: dict[str, list[dict[str, Any]]] = {}
    for r in nodeledger.faults(recs):
        by_node.setdefault(r["node"], []).append(r)
    return [
        {
            "node": n,
            "faults": len(rs),
            "causes": sorted({str(r.get("cause", "?")) for r in rs}),
            "last": max(float(r.get("time", 0)) for r in rs),
            "excluded": n in excluded,
        }
        for n, rs in sorted(by_node.items())
    ]


def tail_records(run_dir: str, n: int = 2000) -> list[dict[str, Any]]:
    """The last ``n`` step records of a run (charts)."""
    path = Path(run_dir) / gp.METRICS_FILE
    try:
        with open(path) as f:
            lines = deque(f, maxlen=n)
    except FileNotFoundError:
        return []
    return step_records(lines)


def step_records(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The step records (a loss and a step) among metrics.jsonl ``lines``."""
    out = []
    for line in lines:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and "loss" in rec and "step" in rec:
            out.append(rec)
    return out
