"""``python -m launcher.rerun RUN_DIR [overrides ...]`` (``meshrun rerun``):
the same run again, in a new run dir: the launcher of the recorded code
snapshot composes the overrides as first typed (so conf/ is the snapshot's
too), the new overrides on top, from the directory it was submitted from;
the container image comes with the config. What it runs is printed first.

A script job's project (``job.workdir``) is rerun from its recorded
snapshot too (``job.workdir`` and ``job.script`` pointed into it), never
re-packed from the live tree. A run whose code or project was not copied
(``launcher.code=live``, or a local run), or whose copy is gone, is rerun
with what its dir holds now; said, with whether the digest still matches.

LOGIN:RUN_DIR (a run submitted over SSH, cluster.login): the rerun runs on
the login node, this same command there with the run's own code, and the
new run dir is on the cluster."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from launcher.config.overrides import quote_value
from launcher.config.prog import describe, plain, prog
from launcher.config.validate import ConfigError
from launcher.run.codesnap import SNAPSHOT_FILE, HashCache, hash_tree, list_tree
from launcher.views.rundiff import load

USAGE = "RUN_DIR|LOGIN:RUN_DIR [key=value ...]"


def _absolute(override: str) -> str:
    """A run dir typed here is relative to here, not to the recorded directory."""
    key, eq, value = override.partition("=")
    if eq and key.lstrip("+~") == "launcher.run_dir" and value:
        return f"{key}={os.path.abspath(value)}"
    return override


def plan(run_dir: str, new: list[str]) -> tuple[list[str], str, str, list[str]]:
    """(the overrides, the code dir, the working dir, notes) of the rerun."""
    rec = load(run_dir)
    code = rec.get("code") or {}
    code_dir = str(code.get("dir") or "")
    notes: list[str] = []
    if not code_dir or not Path(code_dir, "launcher").is_dir():
        raise ConfigError(
            f"{run_dir!r} cannot be rerun: its code dir {code_dir!r} is gone "
            f"(code digest {code.get('digest')}); rerun it by hand from a checkout of git commit "
            f"{(code.get('git') or {}).get('commit')}"
        )
    if not (Path(code_dir).parent / SNAPSHOT_FILE).is_file():
        tree = list_tree(code_dir)
        now = hash_tree(tree, HashCache(None))
        same = "the same code" if now == code.get("digest") else f"CHANGED code (digest now {now[:16]})"
        notes.append(
            f"the run's code was not snapshotted (launcher.code={code.get('mode')}); rerunning {code_dir} "
            f"as it is now: {same}"
        )
    typed = [o for o in rec.get("overrides", []) if o.partition("=")[0].lstrip("+~") != "launcher.run_dir"]
    typed += project_overrides(rec, notes)
    cwd = str(rec.get("cwd") or os.getcwd())
    if not os.path.isdir(cwd):
        notes.append(f"the directory it was submitted from ({cwd}) is gone: rerunning from {os.getcwd()}")
        cwd = os.getcwd()
    return [*typed, *(_absolute(o) for o in new)], code_dir, cwd, notes


def project_overrides(rec: dict, notes: list[str]) -> list[str]:
    """A script job's project from its recorded snapshot (``job.workdir``
    and a ``job.script`` inside it pointed there: packing it again gives the
    same digest), else a note that the live project runs as it is now."""
    project = (rec.get("code") or {}).get("project") or {}
    if not project:
        return []
    entry, source = str(project.get("dir") or ""), str(project.get("source") or "")
    digest = str(project.get("digest") or "")
    if not entry or not (Path(entry).parent / SNAPSHOT_FILE).is_file():
        tree = list_tree(source, tops=(".",), files=()) if os.path.isdir(source) else None
        now = hash_tree(tree, HashCache(None)) if tree is not None else None
        same = (
            "gone"
            if now is None
            else "the same files"
            if now == digest
            else f"CHANGED (digest now {now[:16]})"
        )
        notes.append(
            f"the program's project was not snapshotted or its snapshot is gone ({entry or '-'}): "
            f"rerunning {source} as it is now: {same}"
        )
        return []
    out = [f"job.workdir={quote_value(entry)}"]
    script = str(((rec.get("config") or {}).get("job") or {}).get("script") or "")
    if script and source and Path(script).is_relative_to(source):
        out.append(f"job.script={quote_value(str(Path(entry) / Path(script).relative_to(source)))}")
    notes.append(f"the program's project as submitted: {entry} (digest {digest[:16]}), not the live {source}")
    return out


def _over_ssh(target: str, new: list[str]) -> int | None:
    """LOGIN:RUN_DIR (a run on a cluster behind its login node): rerun there
    (launcher/entry/sshrerun.py); None: a path here."""
    from launcher.entry.sshrerun import rerun_over_ssh
    from launcher.slurm.remote import RemoteError
    from launcher.views.remoterun import remote_target

    try:
        found = remote_target(target)
        return None if found is None else rerun_over_ssh(*found, new)
    except ConfigError as e:
        print(f"meshrun: error: {e}", file=sys.stderr)
        return 2
    except RemoteError as e:
        print(f"meshrun: error: {e}", file=sys.stderr)
        return 3


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        rest = plain((__doc__ or "").strip().split("\n\n", 1)[-1])
        print(f"usage: {prog('python -m launcher.rerun')} {USAGE}\n\n{describe(__doc__)}\n\n{rest}")
        return 0 if argv else 2
    run_dir, new = argv[0], argv[1:]
    if not os.path.exists(run_dir):
        remote = _over_ssh(run_dir, new)
        if remote is not None:
            return remote
    try:
        overrides, code_dir, cwd, notes = plan(run_dir, new)
    except ConfigError as e:
        print(f"meshrun: error: {e}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"meshrun: rerun: {note}")
    print(f"meshrun: rerun of {os.path.abspath(run_dir)} with the code in {code_dir}")
    print(f"meshrun: rerun: overrides {' '.join(overrides[: len(overrides) - len(new)]) or '(none)'}")
    print(f"meshrun: rerun: on top: {' '.join(new) or '(none)'}", flush=True)
    env = {**os.environ, "PYTHONPATH": code_dir, "PYTHONSAFEPATH": "1"}
    return subprocess.run([sys.executable, "-m", "launcher", *overrides], cwd=cwd, env=env).returncode
