"""``meshrun rerun LOGIN:RUN_DIR [overrides]`` from a laptop: the run
recorded on the cluster is rerun there, exactly as ``meshrun rerun RUN_DIR``
on the login node would (launcher/commands/rerun.py from the run's own code
snapshot and the cluster's Python, both read from its run record there), the
overrides as typed, each one shell word. The user's own presets travel as
for a submission (launcher/entry/sshsubmit.py: a rerun composes the
recorded overrides, which may name them). The login node's output is this
command's; the new run dir is on the cluster and the last line says how to
follow it from here.
"""

from __future__ import annotations

import posixpath
import re
import sys

from launcher.config.validate import Login, fail
from launcher.entry.sshsubmit import REMOTE_PATH, SUBMIT_TIMEOUT_S, Sent, remote_env, ship_presets
from launcher.run.codeship import check_store_path
from launcher.run.codewalk import STORE_DIR
from launcher.slurm.remote import NOT_FOUND, RemoteError, check_login_node, remote_run
from launcher.views.remoterun import code_line, remote_record

RUN_DIR_SAID = re.compile(r"^meshrun: run dir (/\S+)")


def _typed_run_dir(new: list[str]) -> str:
    """A typed ``launcher.run_dir`` (the new run dir on the cluster), checked
    as a plain absolute path before any connection; "" when none is typed."""
    run_dir = ""
    for o in new:
        key, eq, value = o.partition("=")
        key = key.lstrip("+~")
        if key in ("cluster.login", "hydra.sweep.dir"):
            raise fail(
                key, value, "is not typed for a rerun over SSH: it runs on the login node, Slurm local"
            )
        if eq and key == "launcher.run_dir":
            if not REMOTE_PATH.match(value) or ".." in value.split("/"):
                raise fail(
                    "launcher.run_dir",
                    value,
                    "names the new run dir on the cluster for a rerun over SSH: an absolute path there of "
                    "letters, digits and '.', '_', '/', '+', '-' (no '..') inside launcher.runs_root",
                )
            run_dir = value
    return run_dir


def _inside(root: str, path: str, field: str) -> None:
    root = root.rstrip("/")
    if not (REMOTE_PATH.match(root) and path.startswith(root + "/")):
        raise fail(field, path, f"must be inside the run's launcher.runs_root={root} on the cluster")


def rerun_over_ssh(login: Login, run_dir: str, new: list[str]) -> int:
    """Rerun ``run_dir`` (on ``login``'s cluster) there with the overrides
    ``new`` on top; its exit code there. Bad input: ConfigError before any
    connection; the login node unreachable: :class:`RemoteError` (one line)."""
    target = _typed_run_dir(new)
    try:
        check_login_node(login)
        rec, py, code = remote_record(login, run_dir)
        root = str(((rec.get("config") or {}).get("launcher") or {}).get("runs_root") or "")
        # A run submitted on the login node itself may name its runs root relative to where it was typed.
        root = posixpath.normpath(posixpath.join(str(rec.get("cwd") or "/"), root)) if root else ""
        _inside(root, run_dir, "RUN_DIR")
        if target:
            _inside(root, target, "launcher.run_dir")
        store = check_store_path(f"{root.rstrip('/')}/{STORE_DIR}", "launcher.runs_root")
        sent = ship_presets(login, store, Sent(code))
    except RemoteError as e:
        raise RemoteError(f"{e} (nothing was rerun)") from e
    # The rerun's own launcher (the snapshot's) runs the recorded code; its
    # environment carries the presets and who asked through.
    words = [py, "-m", "launcher.rerun", run_dir, *new]
    line = code_line(py, code, words, remote_env(sent, code))
    out = remote_run(login, words, line=line, timeout=SUBMIT_TIMEOUT_S)
    if out.returncode == NOT_FOUND and not out.stdout:
        raise RemoteError(
            f"{login.host}: the run's Python {py!r} (its cluster.python) is not found there: rerun it on "
            "the login node with a Python that has meshrun's packages"
        )
    sys.stdout.write(out.stdout)
    sys.stderr.write(out.stderr)
    said = [m[1] for ln in out.stdout.splitlines() if (m := RUN_DIR_SAID.match(ln))]
    if out.returncode == 0 and said:
        print(f"meshrun: rerun over SSH on {login}; follow it from here: meshrun status {login}:{said[-1]}")
    return out.returncode
