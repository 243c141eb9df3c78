"""The fleet of a runs root on a cluster behind its login node, read from a
laptop: ``meshrun fleet LOGIN:/RUNS_ROOT`` (and its ``--serve`` page, served
here).

The login node computes the view as it would for ``meshrun fleet`` typed
there (its run dirs, its sacct and squeue): this machine's meshrun code is
shipped to ``<RUNS_ROOT>/.code`` content-addressed (launcher/run/codeship.py:
usually already there from a submission, so nothing is sent) and
``python -m launcher.fleet RUNS_ROOT --json`` runs there with the cluster's
Python; the JSON becomes the same :class:`~launcher.views.fleetrows.FleetView`
here, printed, watched or served by the same code as a local one. A run's
charts read the end of its metrics.jsonl there. Every call goes over the one
shared ssh connection (launcher/slurm/remote.py); every word of a remote line
is quoted; the login, the runs root and the Python are checked before any
connection.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from launcher.config.schema import LauncherConfig, RunConfig
from launcher.config.userconf import user_conf_dir
from launcher.config.validate import PYTHON, ConfigError, Login, fail, parse_login
from launcher.run.codeship import ship_meshrun
from launcher.slurm.remote import NOT_FOUND, RemoteError, check_login_node, remote_line, remote_run
from launcher.views import goodput as gp
from launcher.views.fleetrows import FleetView, RunRow, step_records
from launcher.views.remoterun import PLAIN_PATH, TARGET

FIELD = "RUNS_ROOT's login (LOGIN:/RUNS_ROOT)"
VIEW_TIMEOUT_S = 120.0
CHART_LINES = 2000  # the end of a run's metrics.jsonl its charts show (as tail_records)


def fleet_target(arg: str) -> tuple[Login, str] | None:
    """``arg`` as (login, runs root on the cluster) when it is LOGIN:/PATH;
    None when it is a path here. A bad login or path: ConfigError."""
    m = TARGET.match(arg)
    if not m:
        return None
    login = parse_login(m["login"], FIELD)
    root = m["path"].rstrip("/")
    if not root or not PLAIN_PATH.match(root) or ".." in root.split("/"):
        raise fail(
            "RUNS_ROOT",
            arg,
            "the runs root on the cluster must be an absolute path (not /) of letters, digits and "
            "'.', '_', '/', '+', '-' (no '..'), e.g. alice@login:/shared/alice/runs",
        )
    return login, root


def preset_python(login: Login) -> str:
    """``python:`` of the user's cluster preset whose ``login:`` is ``login``
    (as ``meshrun init --login`` writes it), else python3."""
    for path in sorted((user_conf_dir() / "cluster").glob("*.yaml")):
        try:
            doc = yaml.safe_load(path.read_text()) or {}
            if isinstance(doc, dict) and doc.get("login") and parse_login(str(doc["login"])) == login:
                return str(doc.get("python") or "python3")
        except (OSError, yaml.YAMLError, ConfigError):
            continue
    return "python3"


def check_python(py: str) -> str:
    if not PYTHON.match(py):
        raise fail(
            "--python",
            py,
            "must be a program name or a path of letters, digits and '.', '_', '/', '+', '-' "
            "(not starting with '-'), e.g. python3 or /opt/venv/bin/python",
        )
    return py


def view_from_json(doc: dict[str, Any]) -> FleetView:
    """The :class:`FleetView` that ``FleetView.to_json`` wrote (a run's
    goodput: the figures the JSON keeps)."""
    names = {f.name for f in fields(RunRow)}

    def rows(key: str) -> list[RunRow]:
        return [RunRow(**{k: v for k, v in r.items() if k in names}) for r in doc.get(key) or []]

    keep = {f.name for f in fields(FleetView)} - {"runs", "others"}
    return FleetView(runs=rows("runs"), others=rows("others"), **{k: doc[k] for k in keep if k in doc})


@dataclass
class RemoteFleet:
    """A runs root on the login node: its fleet view and a run's step records, asked there."""

    login: Login
    root: str
    python: str
    code: str = ""  # the shipped meshrun entry there (set by connect)
    sent_files: int = 0

    def connect(self) -> None:
        """The login node reached (Slurm there) and this machine's meshrun there."""
        check_login_node(self.login)
        # Before anything is made there (the code store): the runs root exists, the Python is there.
        line = f"test -d {shlex.quote(self.root)} || exit 3; {self._guard()}"
        there = remote_run(self.login, ["test", "-d", self.root], line=line).returncode
        if there == 3:
            raise RemoteError(
                f"{self.login.host}: {self.root} is not a folder there: give the runs root its runs are "
                f"under (their launcher.runs_root), e.g. {self.login}:/shared/you/runs"
            )
        if there == NOT_FOUND:
            raise self._no_python()
        cfg = RunConfig(launcher=LauncherConfig(runs_root=self.root))
        shipped, _ = ship_meshrun(self.login, cfg, field="RUNS_ROOT")
        self.code, self.sent_files = shipped.entry, shipped.files

    def view(
        self, *, budget_usd: float | None = None, all_users: bool = False, write: bool = False
    ) -> FleetView:
        """``meshrun fleet RUNS_ROOT --json`` on the login node, as a view here."""
        args = [self.python, "-m", "launcher.fleet", self.root, "--json"]
        args += [*(["--all-users"] if all_users else []), *([] if write else ["--no-write"])]
        args += ["--budget-usd", repr(float(budget_usd))] if budget_usd is not None else []
        env = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": f"{self.code}/meshrun"}
        line = f"{self._guard()}; cd / && exec {remote_line(args, env)}"
        out = remote_run(self.login, args, line=line, timeout=VIEW_TIMEOUT_S)
        if out.returncode == NOT_FOUND and not out.stdout:
            raise self._no_python()
        try:
            doc = json.loads(out.stdout) if out.returncode in (0, 3) else None
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            said = (out.stderr.strip().splitlines() or ["no answer"])[-1][:300]
            raise RemoteError(f"{self.login.host}: meshrun fleet {self.root} failed there: {said}")
        return view_from_json(doc)

    def records(self, run_dir: str) -> list[dict[str, Any]]:
        """The last step records of a run under the runs root (its charts)."""
        if not (run_dir.startswith(self.root + "/") and PLAIN_PATH.match(run_dir)) or ".." in run_dir:
            return []  # only what the view named under this root
        path = f"{run_dir}/{gp.METRICS_FILE}"
        line = shlex.join(["tail", "-n", str(CHART_LINES), "--", path])
        out = remote_run(self.login, ["tail", path], line=line, timeout=VIEW_TIMEOUT_S)
        return step_records(out.stdout.splitlines()) if out.returncode == 0 else []

    def _guard(self) -> str:
        return f"command -v {shlex.quote(self.python)} >/dev/null 2>&1 || exit {NOT_FOUND}"

    def _no_python(self) -> RemoteError:
        return RemoteError(
            f"{self.login.host}: the Python {self.python!r} is not found there: give --python, the login "
            "node's Python with meshrun's packages (hydra-core, omegaconf), e.g. /opt/venv/bin/python"
        )

    def __str__(self) -> str:
        return f"{self.login}:{self.root}"


def remote_fleet(target: str, python: str | None) -> RemoteFleet | None:
    """A :class:`RemoteFleet` for ``target`` (LOGIN:/RUNS_ROOT), checked, not
    yet connected; None when ``target`` is a path here (or is a folder here)."""
    if Path(target).is_dir():
        return None
    found = fleet_target(target)
    if found is None:
        return None
    login, root = found
    return RemoteFleet(login, root, check_python(python or preset_python(login)))
