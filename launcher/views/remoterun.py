"""A run on a cluster behind its login node, followed from a laptop:
``meshrun status|logs|cancel LOGIN:RUN_DIR`` (what a submission over SSH
prints, launcher/entry/sshsubmit.py) runs the same command on the login
node, over the user's own ssh, with the run's own code and Python (its run
record's ``code.dir`` and ``cluster.python``): the run dir, its logs and
Slurm are all there, so the answer is the login node's, word for word.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys

from launcher.config.runfiles import MANIFEST_FILE, PIPELINE_FILE, RECORD_FILE
from launcher.config.validate import PYTHON, ConfigError, Login, parse_login
from launcher.slurm.remote import NOT_FOUND, RemoteError, remote_line, remote_run

# LOGIN:/abs/run/dir (LOGIN as cluster.login: user@host, user@host:port, host).
TARGET = re.compile(r"^(?P<login>[^/]+?):(?P<path>/.*)$")
PLAIN_PATH = re.compile(r"^/[A-Za-z0-9._/+-]*$")
FIELD = "the run's login (LOGIN:RUN_DIR)"
FOLLOW_TIMEOUT_S = 120.0


def remote_target(arg: str) -> tuple[Login, str] | None:
    """``arg`` as (login, run dir on the cluster) when it is LOGIN:/PATH;
    None when it is a path here. A bad login or path: ConfigError."""
    m = TARGET.match(arg)
    if not m:
        return None
    login = parse_login(m["login"], FIELD)
    path = m["path"].rstrip("/") or "/"
    if not PLAIN_PATH.match(path) or ".." in path.split("/"):
        raise ConfigError(
            f"{arg!r}: the run dir on the cluster must be an absolute path of letters, digits and "
            "'.', '_', '/', '+', '-' (no '..'), as the submission printed it"
        )
    return login, path


def read_json(login: Login, path: str) -> tuple[dict, str]:
    out = remote_run(login, ["cat", path], line=f"cat {shlex.quote(path)}")
    try:
        doc = json.loads(out.stdout) if out.returncode == 0 else {}
    except ValueError:
        doc = {}
    return (doc if isinstance(doc, dict) else {}), out.stderr.strip()[:200]


def remote_record(login: Login, run_dir: str) -> tuple[dict, str, str]:
    """(the run record, the cluster's Python, the run's code dir) read on the
    login node (a sweep or pipeline dir: its first submitted point's or stage's)."""
    rec, err = read_json(login, f"{run_dir}/{RECORD_FILE}")
    for name, key in ((MANIFEST_FILE, "points"), (PIPELINE_FILE, "stages")):  # a sweep's, a pipeline's
        if rec:
            break
        doc, _ = read_json(login, f"{run_dir}/{name}")
        runs = doc.get(key) if isinstance(doc.get(key), list) else []
        first = next((p.get("run_dir") for p in runs if isinstance(p, dict) and p.get("job_id")), None)
        if isinstance(first, str) and PLAIN_PATH.match(first):
            rec, err = read_json(login, f"{first}/{RECORD_FILE}")
    try:
        py, code = rec["config"]["cluster"].get("python") or "python3", rec["code"]["dir"]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise RemoteError(
            f"{login.host}: {run_dir} holds no meshrun run record or sweep manifest ({err or 'unreadable'}): "
            "give the run or sweep dir a submission over SSH printed"
        ) from None
    if not (isinstance(py, str) and PYTHON.match(py) and isinstance(code, str) and PLAIN_PATH.match(code)):
        raise RemoteError(f"{login.host}: {run_dir}/{RECORD_FILE} names an odd Python or code dir: not run")
    return rec, py, code


def _code(login: Login, run_dir: str) -> tuple[str, str]:
    return remote_record(login, run_dir)[1:]


def code_line(py: str, code: str, words: list[str], env: dict[str, str] | None = None) -> str:
    """The login node's line that runs ``words`` with a run's code (``code``
    on PYTHONPATH) and Python ``py``: exit 127 when ``py`` is not there."""
    # No __pycache__ written into the run's code entry: it stays exactly its manifest.
    env = {"PYTHONDONTWRITEBYTECODE": "1", **(env or {}), "PYTHONPATH": code}
    guard = f"command -v {shlex.quote(py)} >/dev/null 2>&1 || exit {NOT_FOUND}"
    return f"{guard}; cd / && exec {remote_line(['env', *(f'{k}={v}' for k, v in env.items()), *words])}"


def run_there(login: Login, run_dir: str, module: str, args: list[str]) -> int:
    """``python -m MODULE ARGS`` on the login node with ``run_dir``'s own
    code and Python; its output here, its exit code."""
    py, code = _code(login, run_dir)
    words = [py, "-m", module, *args]
    out = remote_run(login, words, line=code_line(py, code, words), timeout=FOLLOW_TIMEOUT_S)
    if out.returncode == NOT_FOUND and not out.stdout:
        raise RemoteError(f"{login.host}: the run's Python {py} is not found there: was it removed?")
    sys.stdout.write(out.stdout)
    sys.stderr.write(out.stderr)
    return out.returncode


def follow_remote(login: Login, run_dir: str, argv: list[str]) -> int:
    """``python -m launcher.status ARGV`` on the login node (``argv``: the
    action and options, the run dir last); its output here, its exit code."""
    return run_there(login, run_dir, "launcher.status", [*argv, run_dir])


def diff_remote(a: str, b: str, options: list[str]) -> int | None:
    """``meshrun diff A B`` of runs on the cluster: both on one login node,
    run there with A's code; None when both are here. One here and one
    there, or two login nodes: refused (ConfigError), since a diff reads each
    run's code snapshot files, metrics and result, not only its record."""
    ta, tb = (remote_target(x) if not os.path.exists(x) else None for x in (a, b))
    if ta is None and tb is None:
        return None
    if ta is None or tb is None or ta[0] != tb[0]:
        where = " and ".join(f"{t[0]}" if t else "here" for t in (ta, tb))
        raise ConfigError(
            f"run_b: {a!r} and {b!r} are on {where}: meshrun diff compares two runs on one machine (it reads "
            "their code snapshots, metrics and results): give two LOGIN:RUN_DIR of one login node, two "
            "dirs here, or copy one run dir over (rsync -a) first"
        )
    return run_there(ta[0], ta[1], "launcher.diff", [*options, ta[1], tb[1]])


# What the Python API's handle of a remote run asks on the login node: one
# method of launcher.api.Run there, its value as JSON after a marker line.
MARK = "meshrun-api-answer: "  # plain text: str.splitlines splits at control characters
_CALL = f"""
import dataclasses, json, sys
from launcher.api import Run, RunError
run, method, args = Run(sys.argv[1], sys.argv[2] or None), sys.argv[3], json.loads(sys.argv[4])
try:
    value = getattr(run, method)(*args)
    if dataclasses.is_dataclass(value):
        value = {{k: v for k, v in dataclasses.asdict(value).items() if not isinstance(v, dict)}}
    out = {{"value": value}}
except RunError as e:
    out = {{"error": str(e)}}
print({MARK!r} + json.dumps(out))
"""
API_METHODS = ("status", "done", "logs", "cancel", "result")


def api_call(login: Login, run_dir: str, job_id: str | None, method: str, *args: object) -> dict:
    """``Run(run_dir, job_id).<method>(*args)`` on the login node with the
    run's own code and Python: {"value": ...} or {"error": a RunError's text}."""
    if method not in API_METHODS:
        raise ValueError(f"not a Run method: {method} (one of {', '.join(API_METHODS)})")
    py, code = _code(login, run_dir)
    words = [py, "-c", _CALL, run_dir, job_id or "", method, json.dumps(list(args))]
    line = f"cd / && exec env PYTHONDONTWRITEBYTECODE=1 PYTHONPATH={shlex.quote(code)} {shlex.join(words)}"
    out = remote_run(login, [py, "-c", "launcher.api.Run"], line=line, timeout=FOLLOW_TIMEOUT_S)
    said = [ln[len(MARK) :] for ln in out.stdout.splitlines() if ln.startswith(MARK)]
    if out.returncode or not said:
        raise RemoteError(
            f"{login.host}: the run's {method}() could not be read there ({out.stderr.strip()[-300:] or 'no answer'})"
        )
    return json.loads(said[-1])
