"""A Slurm run (a whole sweep, a pipeline) submitted from a machine without Slurm
(a laptop) to the cluster behind ``cluster.login``, over the user's own ssh.

The laptop checks and plans the run as usual (refusals before any
connection), makes the code snapshot in its own store (under
``$XDG_CACHE_HOME/meshrun/ssh``) and ships that entry to the cluster's store
``<launcher.runs_root>/.code`` content-addressed (launcher/run/codeship.py:
nothing sent when the login node holds it intact); the user's own presets
(the config dir ``meshrun init`` writes) travel the same way. Then meshrun
runs on the login node from the shipped code with ``cluster.python``: the
overrides as typed, each one shell word, plus ``cluster.login=`` (there,
Slurm is local) and the run dir (or sweep dir) chosen here. So planning, the
checks against the live QOS limits, the run record (whose ``submitted_from``
names this machine's user and host), ``launcher.after``, a sweep's job arrays
and sbatch run on the login node exactly as when typed there; its output is
this command's, and a refusal there removes what it made (no run dir on
either side). What the remote line carries besides the overrides: the code
and presets folders, PYTHONDONTWRITEBYTECODE and the user@host; no credential.

A script job's project (``job.workdir``) is snapshotted here by the same
rules (launcher/run/codesnap.py) and shipped as its own entry; the remote
line sets ``job.workdir`` to that entry's project folder and ``job.script``
to the program's place in it (typed values of those two are replaced, and
the record keeps the typed ones: ``submitted_from.workdir``, ``.script``,
``.overrides``). The remote snapshot of that folder finds the entry already
in the store by its digest, so the run records the digest made here.
"""

from __future__ import annotations

import dataclasses
import getpass
import json
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import yaml

from launcher.config.runfiles import JOB_FILE, MANIFEST_FILE, PIPELINE_FILE, SLURM_DIR
from launcher.config.schema import RunConfig
from launcher.config.spec import RunSpec
from launcher.config.userconf import CONFIG_DIR_ENV, user_conf_dir
from launcher.config.validate import Login, fail, parse_login
from launcher.run import codestore
from launcher.run.codeship import check_store_path, local_store_root, ship_entry
from launcher.run.codesnap import (
    HASH_CACHE,
    HashCache,
    code_root,
    hash_tree,
    list_tree,
    plan_code,
    store_root,
    store_tree,
)
from launcher.run.codewalk import STORE_DIR
from launcher.run.record import SUBMITTED_FROM_ENV, SUBMITTED_PROJECT_ENV
from launcher.slurm.remote import NOT_FOUND, RemoteError, check_login_node, remote_line, remote_run

SUBMIT_TIMEOUT_S = 600.0  # planning, the checks and sbatch on the login node
SUBMITTED = re.compile(r"^meshrun: submitted job ([0-9]+(?:_[0-9]+)?)")
# launcher.run_dir / runs_root on the cluster: plain absolute paths (they reach the remote line quoted).
REMOTE_PATH = re.compile(r"^/[A-Za-z0-9._/+-]*$")
# The remote line's own values, not the typed ones.
SET_HERE = ("cluster.login", "launcher.run_dir", "hydra.sweep.dir")
# A script job's paths on the cluster: the shipped project's, set on the remote line.
PROJECT_FIELDS = ("job.workdir", "job.script")


def check_remote_paths(cfg: RunConfig, run_dir: str, field: str = "launcher.run_dir") -> tuple[str, str]:
    """(runs root, run dir) on the cluster, checked before any connection:
    both absolute, the run dir inside the runs root."""
    root = cfg.launcher.runs_root
    if not REMOTE_PATH.match(root) or ".." in root.split("/") or root.rstrip("/") == "":
        raise fail(
            "launcher.runs_root",
            root,
            "names the runs root on the cluster when submitting over SSH (cluster.login): an absolute "
            "path there of letters, digits and '.', '_', '/', '+', '-' (no '..'), e.g. /shared/alice/runs",
        )
    root = root.rstrip("/")
    inside = run_dir.startswith(root + "/") and ".." not in run_dir.split("/")
    if not REMOTE_PATH.match(run_dir) or not inside:
        raise fail(
            field,
            run_dir,
            f"must be a folder inside launcher.runs_root={root} on the cluster when submitting over SSH "
            "(cluster.login); leave it unset for a new one there",
        )
    return root, run_dir


def check_remote_submission(
    cfg: RunConfig, run_dir: str, field: str = "launcher.run_dir", *, project: bool = True
) -> Login:
    """Every refusal that needs no connection: the login, the paths, what is
    not shipped (``project=False``: a script job's project dir)."""
    login = parse_login(cfg.cluster.login)
    check_remote_paths(cfg, run_dir, field)
    if cfg.launcher.code == "live":
        raise fail(
            "launcher.code",
            "live",
            "runs a checkout in place, and over SSH (cluster.login) the cluster has none: use snapshot "
            "(the default) or clean",
        )
    if cfg.job.kind == "script" and cfg.job.workdir:
        if not project:
            raise fail(
                "job.workdir",
                cfg.job.workdir,
                "a pipeline's project dir is not shipped over SSH yet (cluster.login): submit each "
                "stage as its own run, or the pipeline on the login node",
            )
        script_on_cluster(cfg, "<project>", "<meshrun>")  # a script outside the project: refused here
    return login


def _inside(path: str, root: str) -> str | None:
    """``path`` relative to ``root`` when it lies inside it, else None."""
    rel = os.path.relpath(path, root)
    return None if rel == ".." or rel.startswith("../") or os.path.isabs(rel) else rel


def script_on_cluster(cfg: RunConfig, project: str, code: str) -> str:
    """A script job's ``job.script`` on the cluster: its place in the shipped
    project ``project`` (or in the shipped meshrun code ``code``: the Hydra
    launcher's own task); "" for ``job.module``. Refused outside both:
    nothing else of this machine is shipped."""
    j = cfg.job
    if not j.script:
        return ""
    script = os.path.abspath(j.script)
    rel = _inside(script, os.path.abspath(j.workdir))
    if rel is not None:
        return f"{project}/{rel}"
    own = _inside(script, code_root())
    if own is not None:
        return f"{code}/meshrun/{own}"
    raise fail(
        "job.script",
        j.script,
        f"lies outside job.workdir={j.workdir}: over SSH (cluster.login) only the project dir is "
        "shipped; move the program into it, or set job.workdir to a folder that holds it",
    )


@dataclasses.dataclass
class Sent:
    code: str  # the code entry's folder on the cluster
    conf: str | None = None  # the user's presets there (MESHRUN_CONFIG_DIR); None: none here
    files: int = 0  # files sent, every entry
    bytes: int = 0
    project: str | None = None  # a script job's project folder there; None: no project
    project_digest: str = ""  # its digest (the same here and there)


def _ship(cfg: RunConfig, login: Login) -> Sent:
    """The code snapshot and the user's own presets (the config dir ``meshrun
    init`` writes: a preset named on the command line composes there as
    here), each made an entry of this machine's store, then shipped."""
    runs_root = str(local_store_root())
    here = dataclasses.replace(cfg, launcher=dataclasses.replace(cfg.launcher, runs_root=runs_root))
    local = store_root(here)
    store = check_store_path(f"{cfg.launcher.runs_root.rstrip('/')}/{STORE_DIR}", "launcher.runs_root")
    tree, project = plan_code(here)
    entry, _ = store_tree(tree, local, "meshrun")
    code = ship_entry(login, Path(entry).parent, store)
    sent = Sent(code.entry, None, code.files, code.bytes_sent)
    if project is not None:  # job.workdir: the same rules as on the login node (codesnap, codewalk)
        entry, _ = store_tree(project, local, "project")
        shipped = ship_entry(login, Path(entry).parent, store)
        sent.project, sent.project_digest = f"{shipped.entry}/project", project.digest
        sent.files, sent.bytes = sent.files + shipped.files, sent.bytes + shipped.bytes_sent
    return ship_presets(login, store, sent, local)


def ship_presets(login: Login, store: str, sent: Sent, local: Path | None = None) -> Sent:
    """The user's own presets (the config dir ``meshrun init`` writes), made
    an entry of this machine's store (``local``) and shipped to ``store`` on
    the cluster: ``sent`` with their folder there and what was sent added."""
    local = local or local_store_root().resolve() / STORE_DIR
    conf_dir = user_conf_dir()
    conf = list_tree(str(conf_dir), tops=(".",), files=()) if conf_dir.is_dir() else None
    if conf is not None and conf.files:  # credential-looking files are left out (launcher/run/codewalk.py)
        hash_tree(conf, HashCache(codestore.user_store(local) / HASH_CACHE))
        entry, _ = store_tree(conf, local, "project")
        presets = ship_entry(login, Path(entry).parent, store, role="presets")
        sent.conf = f"{presets.entry}/project"
        sent.files, sent.bytes = sent.files + presets.files, sent.bytes + presets.bytes_sent
    return sent


def remote_env(
    sent: Sent, code: str = "", cfg: RunConfig | None = None, typed: list[str] | None = None
) -> dict[str, str]:
    """The remote meshrun's environment: the shipped code (``code``: that
    folder instead) and presets, who submitted; with a shipped project, its
    paths here and ``typed`` (the overrides as typed) for the record."""
    # No __pycache__ written into the shipped entry: it stays exactly its manifest (checked at every use).
    env = {"PYTHONPATH": code or f"{sent.code}/meshrun", "PYTHONDONTWRITEBYTECODE": "1"}
    if sent.conf:
        env[CONFIG_DIR_ENV] = sent.conf
    env[SUBMITTED_FROM_ENV] = f"{getpass.getuser()}@{socket.gethostname()}"
    if not re.fullmatch(r"[A-Za-z0-9_.-]+@[A-Za-z0-9.-]+", env[SUBMITTED_FROM_ENV]):
        del env[SUBMITTED_FROM_ENV]  # a name the record would not take: said nowhere rather than garbled
    if sent.project and cfg is not None:
        here = {"workdir": cfg.job.workdir, "script": cfg.job.script, "overrides": list(typed or [])}
        env[SUBMITTED_PROJECT_ENV] = json.dumps(here, separators=(",", ":"))
    return env


def hydra_value(value: str) -> str:
    """One Hydra override value, quoted (a path with spaces, commas or quotes stays one value)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _key(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0]


def project_overrides(cfg: RunConfig, sent: Sent) -> list[str]:
    """``job.workdir`` and ``job.script`` on the cluster: the shipped project's."""
    if not sent.project:
        return []
    script = script_on_cluster(cfg, sent.project, sent.code)
    return [
        f"job.workdir={hydra_value(sent.project)}",
        *([f"job.script={hydra_value(script)}"] if script else []),
    ]


def check_project_not_swept(cfg: RunConfig, overrides: list[str]) -> None:
    """A sweep over SSH ships one project: job.workdir / job.script swept is refused here."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if not (cfg.job.kind == "script" and cfg.job.workdir):
        return
    parser = OverridesParser.create()
    for o in overrides:
        if _key(o) in PROJECT_FIELDS and parser.parse_override(o).is_sweep_override():
            raise fail(
                _key(o),
                o.split("=", 1)[1],
                "one program and project per sweep over SSH (cluster.login): sweep its arguments "
                "(job.args) or submit one sweep per program",
            )


def checked_and_shipped(
    cfg: RunConfig, where: str, field: str, *, project: bool = True
) -> tuple[Login, Sent]:
    """Every refusal that needs no connection, then the login node reached
    (Slurm there) and the code and presets shipped: before anything is submitted."""
    login = check_remote_submission(cfg, where, field, project=project)
    try:
        check_login_node(login)
        return login, _ship(cfg, login)
    except RemoteError as e:
        raise RemoteError(f"{e} (nothing was submitted)") from e


def guard(py: str) -> str:
    """The remote line's first command: exit NOT_FOUND when ``py`` is not there."""
    return f"command -v {shlex.quote(py)} >/dev/null 2>&1 || exit {NOT_FOUND}"


def remote_program(cfg: RunConfig, sent: Sent, args: list[str], typed: list[str]) -> str:
    """The login node's shell line running ``args`` (a program of the shipped
    code, with ``cfg.cluster.python``) in the runs root, under the remote environment."""
    py = cfg.cluster.python
    env = remote_env(sent, cfg=cfg, typed=typed)
    return f"{guard(py)}; cd {shlex.quote(cfg.launcher.runs_root)} && exec {remote_line([py, *args], env)}"


def remote_command(
    cfg: RunConfig, run_dir: str, sent: Sent, overrides: list[str], *, sweep: bool = False
) -> str:
    """The login node's shell line: meshrun from the shipped code with the
    cluster's Python, the overrides as typed (each one word), in the runs
    root; ``sweep``: ``-m`` with ``run_dir`` the sweep dir."""
    py, env = cfg.cluster.python, remote_env(sent, cfg=cfg, typed=overrides)
    # Slurm is local there; the run dir is the one checked here; the project's paths are there.
    mine = (*SET_HERE, *(PROJECT_FIELDS if sent.project else ()))
    typed = [o for o in overrides if _key(o) not in mine]
    where = f"hydra.sweep.dir={run_dir}" if sweep else f"launcher.run_dir={run_dir}"
    project = project_overrides(cfg, sent)
    args = [py, "-m", "launcher", *(["-m"] if sweep else []), *typed, *project, "cluster.login=", where]
    return f"{guard(py)}; cd {shlex.quote(cfg.launcher.runs_root)} && exec {remote_line(args, env)}"


def submit_over_ssh(spec: RunSpec, overrides: list[str], *, sweep_dir: str = "") -> int:
    """Submit ``spec`` on its login node (``sweep_dir``: the whole sweep
    ``overrides`` makes, ``spec`` one of its points); the exit code there
    (0: submitted). A failure to reach it raises :class:`RemoteError` (one line)."""
    cfg = spec.cfg
    where = sweep_dir or spec.run_dir
    if sweep_dir:
        check_project_not_swept(cfg, overrides)
    login, sent = checked_and_shipped(cfg, where, "hydra.sweep.dir" if sweep_dir else "launcher.run_dir")
    line = remote_command(cfg, where, sent, overrides, sweep=bool(sweep_dir))
    kind = "sweep" if sweep_dir else "run"
    try:
        out = remote_run(login, [cfg.cluster.python, "-m", "launcher"], line=line, timeout=SUBMIT_TIMEOUT_S)
    except RemoteError as e:
        return _lost(login, where, kind, e)
    done = out.returncode == 0 and (
        bool(sweep_dir) or any(SUBMITTED.match(ln) for ln in out.stdout.splitlines())
    )
    return _relay(login, cfg, out, sent, where, done)


def _relay(
    login: Login, cfg: RunConfig, out: subprocess.CompletedProcess[str], sent: Sent, where: str, done: bool
) -> int:
    """The login node's output here, and where to follow it from here; its exit code."""
    if out.returncode == NOT_FOUND and not out.stdout:
        raise RemoteError(
            f"{login.host}: cluster.python={cfg.cluster.python!r} is not found there: set it to the login "
            "node's Python with meshrun's packages (hydra-core, omegaconf), e.g. /opt/venv/bin/python"
        )
    sys.stdout.write(out.stdout)
    sys.stderr.write(out.stderr)
    if done:
        said = (
            f"{sent.files} files, {sent.bytes / 1e6:.1f} MB sent"
            if sent.files
            else "already there, nothing sent"
        )
        presets = f"; your presets {sent.conf}" if sent.conf else ""
        project = f"; project {sent.project_digest[:16]} in {sent.project}" if sent.project else ""
        print(f"meshrun: submitted over SSH to {login}; code {sent.code}{presets}{project} ({said})")
        print(f"meshrun: follow it from here: meshrun status {login}:{where}")
    return out.returncode


# What a submission leaves on the login node once Slurm took it: the job id(s) it names.
RECORDS = {"run": f"{SLURM_DIR}/{JOB_FILE}", "sweep": MANIFEST_FILE, "pipeline": PIPELINE_FILE}
JOB_ID = re.compile(r"^[0-9]+(?:_[0-9]+)?$")


def went_through(login: Login, where: str, kind: str) -> list[str]:
    """The job ids the login node's record of the submission to ``where``
    names (``kind``: run, sweep or pipeline); [] when there is none or it
    cannot be read."""
    try:
        out = remote_run(login, ["cat", f"{where}/{RECORDS[kind]}"])
        doc = json.loads(out.stdout) if out.returncode == 0 else {}
    except (RemoteError, ValueError):
        return []
    if not isinstance(doc, dict):
        return []
    rows = [doc] if kind == "run" else doc.get("points" if kind == "sweep" else "stages") or []
    ids = [str(r.get("job_id") or "") for r in rows if isinstance(r, dict)]
    return [i for i in ids if JOB_ID.match(i)]


def _lost(login: Login, where: str, kind: str, e: RemoteError) -> int:
    """The connection failed while the login node submitted (it dropped, or
    no answer came in time): Slurm may have the job all the same. Asked
    again over a new connection: 0 with the job(s) said when the record
    there names them; else the failure, saying that it is not known."""
    jobs = went_through(login, where, kind)
    target = f"{login}:{where}"
    if not jobs:
        raise RemoteError(
            f"{e}; the submission's answer never came back and {where} names no job there yet: whether "
            f"Slurm took it is not known; once {login.host} answers, check with `meshrun status {target}`"
        ) from e
    said = "the connection was lost before the login node's answer came back; its record names it"
    if kind == "run":
        print(f"meshrun: submitted job {jobs[0]} ({said})")
    else:
        print(f"meshrun: {kind} submitted: job(s) {', '.join(jobs)} ({said})")
    print(f"meshrun: follow it from here: meshrun status {target}")
    return 0


def submit_pipeline_over_ssh(spec: RunSpec, doc: dict, pipeline_dir: str) -> int:
    """``meshrun pipeline`` on the login node: the pipeline file ``doc``
    (every stage's ``cluster.login`` cleared: Slurm is local there) on its
    stdin, ``spec`` its first stage's; its exit code there."""
    cfg = spec.cfg
    login, sent = checked_and_shipped(cfg, pipeline_dir, "--dir", project=False)
    doc = {**doc, "stages": {n: {**b, "overrides": [*(b.get("overrides") or []), "cluster.login="]}
                              for n, b in doc["stages"].items()}}  # fmt: skip
    py = cfg.cluster.python
    env = remote_env(sent)
    args = [py, "-m", "launcher.pipeline", '"$T"', "--dir", pipeline_dir]
    run = " ".join(a if a == '"$T"' else shlex.quote(a) for a in args)
    line = (
        f"{guard(py)}; umask 077; "
        f'cd {shlex.quote(cfg.launcher.runs_root)} && T=$(mktemp) && cat > "$T" && '
        f'{remote_line(["env", *(f"{k}={v}" for k, v in env.items())])} {run}; rc=$?; rm -f "$T"; exit $rc'
    )
    try:
        out = remote_run(login, [py, "-m", "launcher.pipeline"], line=line, timeout=SUBMIT_TIMEOUT_S,
                         stdin=yaml.safe_dump(doc).encode())  # fmt: skip
    except RemoteError as e:
        return _lost(login, pipeline_dir, "pipeline", e)
    return _relay(login, cfg, out, sent, pipeline_dir, done=out.returncode == 0)


def job_id_from(stdout: str) -> str:
    """The job id a remote submission printed ("" when none)."""
    return next((m[1] for ln in stdout.splitlines() if (m := SUBMITTED.match(ln))), "")
