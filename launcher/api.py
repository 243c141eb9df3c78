"""meshrun from Python (notebooks, pipelines), over the commands' own code::

    from launcher import api
    print(api.plan(["model=tiny", "cluster=testcluster"]).report)  # the dry run
    run = api.submit(["cluster=testcluster", "train.steps=20"])    # returns at once
    run.wait()                                                     # COMPLETED, FAILED, ...
    print(run.result()["final_loss"])                              # result.json

:func:`plan` and :func:`submit` compose, check and plan in this process
(launcher/run/prepare.py, as ``python -m launcher``): a refused override
raises :class:`ConfigError` with the CLI's message, and nothing is written.
A Slurm run is submitted here (``submit_slurm``, the CLI's) and returns at
once. A ``cluster=local`` run, which the CLI runs in the foreground, is
started as ``python -m launcher ... launcher.run_dir=<its run dir>`` in a
background process (its own output in ``Run.launcher_log``); the handle
works the same. :func:`sweep` runs ``python -m launcher -m`` (Slurm points:
one job array per distinct request, returning at once; local points in the
background, one after another) and returns one handle per point of its
``manifest.json``. With ``cluster.login`` both submit on the login node
(launcher/entry/sshsubmit.py) and return :class:`RemoteRun` handles. A handle's ``status()``, ``logs()`` and ``cancel()`` are
``meshrun status / logs / cancel`` (launcher/views/runstate.py). Importing this
module imports neither torch nor Hydra.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.config.plandata import CostEstimate
from launcher.config.plandata import Plan as PlanData
from launcher.config.runfiles import FAILURES_FILE, RESULT_FILE
from launcher.config.spec import RunSpec
from launcher.config.validate import ConfigError
from launcher.views.runstate import MANIFEST, Row

if TYPE_CHECKING:
    from launcher.entry.launch import Verdict

__all__ = [
    "ConfigError",
    "Plan",
    "RemoteRun",
    "Run",
    "RunError",
    "SweepFailed",
    "follow",
    "plan",
    "submit",
    "sweep",
]


class RunError(RuntimeError):
    """A run has no result: it failed, was stopped, or has not ended."""


class SweepFailed(RuntimeError):
    """``python -m launcher -m`` submitted nothing; its message says why."""


@dataclass
class Plan:
    """The dry run of one run: what ``launcher.dry_run=true`` prints, as data."""

    spec: RunSpec
    layout: str  # e.g. "fsdp: dp_shard=2 (2 ranks, cpu/gloo)"
    memory_gb: float  # per GPU (per rank on CPU)
    step_s: float | None  # predicted step time (GPU plans with a known peak), else None
    cost: CostEstimate | None
    report: str  # the plan's tables as the CLI prints them
    sbatch: str | None  # the exact sbatch script (Slurm runs), else None
    # Slurm runs: what the cluster says of the request (the CLI dry run's
    # "a submission here would be refused: ..."), else None.
    verdict: Verdict | None = None

    @property
    def plan(self) -> PlanData:
        return self.spec.plan

    @property
    def refused(self) -> str | None:
        """Why a submission of this plan would be refused here; None when
        Slurm accepts it (or could not be asked: ``verdict.note`` then)."""
        return self.verdict.refused if self.verdict else None


def _prepared(overrides: list[str], *extra: str) -> RunSpec:
    """Compose and check one run as ``python -m launcher`` does; writes nothing."""
    from launcher.config.compose import compose
    from launcher.run.continuation import continued_config
    from launcher.run.prepare import prepare
    from launcher.run.rundir import default_run_dir

    cfg = compose([*overrides, *extra])
    run_dir = cfg.launcher.run_dir or default_run_dir(cfg)
    # A run dir that holds a run: its saved config, the overrides on top (as the CLI).
    return prepare(continued_config(cfg, run_dir, [*overrides, *extra]), run_dir)


def plan(overrides: list[str]) -> Plan:
    """The dry run of ``python -m launcher OVERRIDES``: layout, memory,
    predicted step, cost, the report and the sbatch script; submits nothing."""
    from rich.console import Console

    from launcher.config.runid import new_run_id, read_run_id, run_name
    from launcher.entry.launch import sbatch_text, slurm_verdict
    from launcher.plan.planner import plan_layout_summary
    from launcher.views.planreport import print_plan

    spec = _prepared(list(overrides), "launcher.dry_run=true")
    cfg, p = spec.cfg, spec.plan
    spec.run_id = read_run_id(spec.run_dir) or new_run_id(run_name(cfg))  # shown, not stored
    console = Console(file=io.StringIO(), width=120, record=True)
    print_plan(cfg, p, console)
    step_s = None
    if cfg.job.kind != "script" and p.device == "cuda" and p.gpu_peak_bf16_tflops > 0:
        from launcher.perf import predict

        step_s = predict(cfg, p).step_time_s
    return Plan(
        spec=spec,
        layout=plan_layout_summary(p),
        memory_gb=p.memory.total_gb,
        step_s=step_s,
        cost=p.cost,
        report=console.export_text(),
        sbatch=sbatch_text(spec)[1] if cfg.cluster.kind == "slurm" else None,
        verdict=slurm_verdict(spec) if cfg.cluster.kind == "slurm" else None,
    )


@dataclass
class Run:
    """One run's handle: its run dir, and its Slurm job id (None for a local run)."""

    run_dir: str
    job_id: str | None = None
    launcher_log: str | None = None  # a background launcher's output (local runs)
    reason: str = ""  # a sweep point that was refused or failed: why (it has no run)
    state: str = ""  # that point's state: INVALID or FAILED
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    def status(self) -> Row:
        """``meshrun status RUN_DIR``'s row: state, elapsed, step, loss, tokens/s, ..."""
        from launcher.views.runstate import table

        if self.reason:
            return Row("-", self.run_dir, self.job_id, state=self.state)
        try:
            row = table(Path(self.run_dir))[0]
        except ValueError:  # no spec.json yet: a local launcher still checking, or none
            row = Row("-", self.run_dir, self.job_id, state="NOT STARTED")
        if self._proc is not None and self._proc.poll() is None and row.state == "NOT STARTED":
            row.state = "PENDING"  # its background launcher has not started it yet
        return row

    def done(self) -> bool:
        from launcher.views.runstate import ended

        if self.reason:
            return True
        row = self.status()
        if row.state == "PREEMPTED" and row.job_id:
            # Final unless Slurm requeued it: a requeued job is back in the queue.
            return not _queued(row.job_id)
        return ended(row) and row.state != "PENDING"

    def wait(self, timeout_s: float | None = None, poll_s: float = 5.0) -> Row:
        """Block until the run has ended (COMPLETED, FAILED, CANCELLED, ...);
        its last status row. TimeoutError after ``timeout_s``."""
        end = None if timeout_s is None else time.monotonic() + timeout_s
        while not self.done():
            if end is not None and time.monotonic() > end:
                raise TimeoutError(f"run {self.run_dir} still {self.status().state} after {timeout_s:g} s")
            time.sleep(poll_s)
        return self.status()

    def logs(self, rank: int = 0, tail: int = 50) -> str:
        """The last ``tail`` lines of the file holding global rank ``rank``'s
        output ("" when none yet; under torchrun the log of the node hosting it)."""
        from launcher.views.runstate import log_file
        from launcher.views.runstate import tail as tail_of

        if self.reason:
            return ""
        log, _ = log_file(self.run_dir, self.job_id, rank)
        return tail_of(log, tail) if log else ""

    def cancel(self) -> bool:
        """``meshrun cancel RUN_DIR``: scancel its job, or stop a local run;
        False when there was nothing to cancel (it has ended: said why)."""
        from launcher.views.runstate import cancel_counts

        if self.reason:
            return False
        return cancel_counts(Path(self.run_dir))[0] > 0

    def result(self) -> dict[str, Any]:
        """The completed run's result.json (final step and loss, ...);
        :class:`RunError` saying why there is none."""
        if self.reason:
            raise RunError(f"{self.run_dir or 'sweep point'}: {self.state.lower()}: {self.reason}")
        try:
            res = json.loads((Path(self.run_dir) / RESULT_FILE).read_text())
        except (OSError, ValueError):
            res = None
        if isinstance(res, dict) and res.get("status") == "completed":
            return res
        row = self.status()
        why = [f"run {self.run_dir} has no result: it is {row.state}"]
        if isinstance(res, dict):
            why.append(f"result.json says {res.get('status')!r} at step {res.get('final_step')}")
        failures = Path(self.run_dir) / FAILURES_FILE
        if failures.exists():
            last = failures.read_text(errors="replace").strip().splitlines()
            why += [f"last failure: {last[-1]}"] if last else []
        if self.launcher_log and Path(self.launcher_log).exists():
            said = [x for x in Path(self.launcher_log).read_text().splitlines() if "error" in x]
            why += said[-1:]
        raise RunError("; ".join(why))


@dataclass
class RemoteRun(Run):
    """A run submitted over SSH (cluster.login): its run dir is on the
    cluster; each method runs the same ``Run`` method on the login node with
    the run's own code (launcher/views/remoterun.py). Its status row has no
    ``summary`` or ``forecast`` (the table's columns only)."""

    login: str = ""

    def _call(self, method: str, *args: object) -> Any:
        from launcher.config.validate import parse_login
        from launcher.views.remoterun import api_call

        out = api_call(parse_login(self.login), self.run_dir, self.job_id, method, *args)
        if "error" in out:
            raise RunError(out["error"])
        return out["value"]

    def status(self) -> Row:
        return Row(**self._call("status"))

    def done(self) -> bool:
        return bool(self._call("done"))

    def logs(self, rank: int = 0, tail: int = 50) -> str:
        return str(self._call("logs", rank, tail))

    def cancel(self) -> bool:
        return bool(self._call("cancel"))

    def result(self) -> dict[str, Any]:
        return dict(self._call("result"))


def _submit_over_ssh(spec: RunSpec, overrides: list[str]) -> RemoteRun:
    """``submit`` of a run for a cluster behind its login node: submitted
    there (launcher/entry/sshsubmit.py), its output echoed; a refusal there
    raises :class:`ConfigError` with its line."""
    from contextlib import redirect_stderr, redirect_stdout

    from launcher.entry.sshsubmit import job_id_from, submit_over_ssh

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = submit_over_ssh(spec, overrides)
    sys.stdout.write(out.getvalue())
    sys.stderr.write(err.getvalue())
    job_id = job_id_from(out.getvalue())
    if code or not job_id:
        said = [ln for ln in err.getvalue().splitlines() if ln.startswith("meshrun: error: ")]
        raise ConfigError(
            said[-1].removeprefix("meshrun: error: ") if said else f"submission failed there (exit {code})"
        )
    return RemoteRun(spec.run_dir, job_id, login=spec.cfg.cluster.login)


def _queued(job_id: str) -> bool:
    """The job (or its array) is in Slurm's queue (pending, requeued, running)."""
    from launcher.slurm.cluster import SlurmError, queue

    base = job_id.split("_")[0]
    try:
        # squeue's %i: "123", an array task "123_4", pending tasks "123_[4-7]".
        return any(
            q.get("JobID", "") in (job_id, base) or q.get("JobID", "").startswith(f"{base}_[")
            for q in queue()
        )
    except SlurmError:
        return True  # not known: keep waiting (the timeout still ends it)


def _background(argv: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    """``python -m launcher ARGV`` in the background with this process's
    meshrun first on its path; (the process, its output file)."""
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    fd, log = tempfile.mkstemp(prefix="meshrun-launcher-", suffix=".log")
    with os.fdopen(fd, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "launcher", *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # a notebook's Ctrl-C does not reach it; cancel() does
        )
    return proc, log


def submit(overrides: list[str]) -> Run:
    """``python -m launcher OVERRIDES`` without waiting: a Slurm run is
    submitted (the job id in the handle), a local run starts in the
    background. A refused override raises :class:`ConfigError`, nothing written."""
    from launcher.entry.launch import submit_slurm
    from launcher.run.codesnap import forget_listings
    from launcher.slurm.submit import read_job_id

    forget_listings()  # this process may have submitted an older version of the code
    overrides = list(overrides)
    spec = _prepared(overrides)
    if spec.cfg.launcher.dry_run:
        raise ConfigError("launcher.dry_run=true submits nothing: use api.plan(overrides) for the dry run")
    if spec.cfg.cluster.login:  # submitted on the login node; the handle asks there
        return _submit_over_ssh(spec, overrides)
    if spec.cfg.cluster.kind == "slurm":
        submit_slurm(spec, overrides)
        return Run(spec.run_dir, read_job_id(spec.run_dir))
    proc, log = _background([*overrides, f"launcher.run_dir={spec.run_dir}"])
    return Run(spec.run_dir, launcher_log=log, _proc=proc)


def _sweep_dir(overrides: list[str]) -> tuple[list[str], Path]:
    given = [o.split("=", 1)[1] for o in overrides if o.startswith("hydra.sweep.dir=")]
    if given:
        return overrides, Path(given[-1]).resolve()
    import secrets

    d = Path("runs", "sweeps", f"{time.strftime('%Y-%m-%d_%H-%M-%S')}-{secrets.token_hex(2)}").resolve()
    return [*overrides, f"hydra.sweep.dir={d}"], d


def sweep(overrides: list[str], *, timeout_s: float = 600.0) -> list[Run]:
    """``python -m launcher -m OVERRIDES`` (Hydra's sweep syntax,
    ``train.lr=1e-3,3e-3``): one handle per point, in point order. Slurm
    points are submitted as job arrays before this returns; local points run
    in the background. A refused or failed point's handle has ``reason``;
    :class:`SweepFailed` when no point was accepted (nothing is written)."""
    from launcher.run.codesnap import forget_listings

    forget_listings()  # this process may have submitted an older version of the code
    point = _first_point(list(overrides))
    if point is not None and _login_of(point):  # the whole sweep goes to the login node; handles ask there
        return _sweep_over_ssh(_prepared(point), list(overrides))
    argv, sweep_dir = _sweep_dir(list(overrides))
    manifest = sweep_dir / MANIFEST
    if manifest.exists():
        # Its handles would be an earlier sweep's, returned as if new.
        raise SweepFailed(
            f"hydra.sweep.dir={sweep_dir} already holds a sweep ({MANIFEST}): give another "
            "hydra.sweep.dir for a new sweep, or follow that one with api.follow(sweep_dir)"
        )
    proc, log = _background(["-m", *argv])
    end = time.monotonic() + timeout_s
    # Slurm points: the process ends once they are submitted; local ones run
    # after the manifest is written.
    while proc.poll() is None and not manifest.exists() and time.monotonic() < end:
        time.sleep(0.2)
    if proc.poll() is None and not manifest.exists():
        proc.terminate()
        raise SweepFailed(
            f"python -m launcher -m did not finish submitting in {timeout_s:g} s (output: {log})"
        )
    if not manifest.exists():
        said = [x for x in Path(log).read_text().splitlines() if "invalid:" in x or "error:" in x]
        raise SweepFailed("; ".join(x.split("meshrun:", 1)[-1].strip() for x in said) or f"see {log}")
    return _handles(manifest, log, proc if proc.poll() is None else None)


def _first_point(overrides: list[str]) -> list[str] | None:
    """The overrides of the sweep's first point (each sweep override's first
    value); None when Hydra cannot read them (the sweep itself says why)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Override

    try:
        hydra_own = ("hydra.", "hydra/")  # Hydra's own settings: not a point's
        parsed = OverridesParser.create().parse_overrides(
            [o for o in overrides if not o.lstrip("+~").startswith(hydra_own)]
        )
        # Hydra's own formatting of a value back into its grammar (lists, quoted strings).
        return [
            f"{o.get_key_element()}={Override._get_value_element_as_str(next(iter(o.sweep_iterator())))}"
            if o.is_sweep_override()
            else str(o.input_line)
            for o in parsed
        ]
    except Exception:  # Hydra's own parse error, a glob sweep: left to the sweep
        return None


def _login_of(point: list[str]) -> str:
    """The point's cluster.login ("" when it does not compose: the sweep itself says why)."""
    from launcher.config.compose import compose

    try:
        return compose(point).cluster.login
    except ConfigError:
        return ""


def _sweep_over_ssh(first: RunSpec, overrides: list[str]) -> list[Run]:
    """``sweep`` for a cluster behind its login node: ``python -m launcher -m``
    runs there (launcher/entry/sshsubmit.py) in ``hydra.sweep.dir`` (a folder
    inside launcher.runs_root there; unset: a new one under its sweeps/);
    one :class:`RemoteRun` per submitted point, read from its manifest there."""
    import secrets
    from contextlib import redirect_stderr, redirect_stdout

    from launcher.config.validate import parse_login
    from launcher.entry.sshsubmit import submit_over_ssh
    from launcher.views.remoterun import read_json

    cfg = first.cfg
    if cfg.launcher.dry_run:
        raise ConfigError(
            "launcher.dry_run=true submits nothing: use api.plan(overrides) for one point's dry run"
        )
    given = [o.split("=", 1)[1] for o in overrides if o.startswith("hydra.sweep.dir=")]
    stamp = f"{time.strftime('%Y-%m-%d_%H-%M-%S')}-{secrets.token_hex(2)}"
    there = given[-1] if given else f"{cfg.launcher.runs_root.rstrip('/')}/sweeps/{stamp}"
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = submit_over_ssh(first, overrides, sweep_dir=there)
    sys.stdout.write(out.getvalue())
    sys.stderr.write(err.getvalue())
    login = parse_login(cfg.cluster.login)
    doc, why = read_json(login, f"{there}/{MANIFEST}") if code == 0 else ({}, "")
    points = doc.get("points") if isinstance(doc.get("points"), list) else None
    if code or points is None:
        said = [x for x in err.getvalue().splitlines() if "invalid:" in x or "error:" in x]
        raise SweepFailed(
            "; ".join(x.split("meshrun:", 1)[-1].strip() for x in said)
            or f"{login.host}: the sweep in {there} was not submitted (exit {code}{'; ' + why if why else ''})"
        )
    runs: list[Run] = []
    for p in points:
        status = str(p.get("status", ""))
        if status in ("invalid", "failed"):
            runs.append(
                Run(p.get("run_dir", ""), p.get("job_id"), reason=p.get("reason", ""), state=status.upper())
            )
        else:
            runs.append(RemoteRun(p.get("run_dir", ""), p.get("job_id"), login=cfg.cluster.login))
    return runs


def follow(sweep_dir: str | os.PathLike[str]) -> list[Run]:
    """Handles of an earlier sweep's points, from its ``manifest.json``."""
    manifest = Path(sweep_dir).resolve() / MANIFEST
    if not manifest.exists():
        raise SweepFailed(f"{manifest} does not exist: {sweep_dir} is not a sweep dir")
    return _handles(manifest, None, None)


def _handles(manifest: Path, log: str | None, local: subprocess.Popen[bytes] | None) -> list[Run]:
    points = json.loads(manifest.read_text())["points"]
    runs = []
    for p in points:
        status = p.get("status", "")
        bad = status in ("invalid", "failed")
        runs.append(
            Run(
                p.get("run_dir", ""),
                p.get("job_id"),
                launcher_log=log,
                reason=p.get("reason", "") if bad else "",
                state=status.upper() if bad else "",
                _proc=local,
            )
        )
    return runs
