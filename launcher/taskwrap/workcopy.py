"""A script job's working directory: its own copy of the packed project.

The packed project (launcher/run/codesnap.py) is content-addressed: every
run and sweep point with the same code shares one store entry. A program
that writes beside its code (Lightning's ``lightning_logs/`` and
``hpc_ckpt_N.ckpt`` in the cwd, a ``./outputs`` dir) would write into that
shared entry, and a later run with the same code would find, and resume
from, another run's files. So each run starts its program in
``<run dir>/workdir``: the packed files hard-linked (copied where a link
cannot be made: another filesystem, a container's separate mounts), made
once per run by whichever task gets there first and kept across restarts
and requeues, where the program finds what it wrote. A rerun is a new run
dir, so a fresh copy.

Standard library only, as the wrapper."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from pathlib import Path

WORKDIR = "workdir"
DONE_MARK = ".meshrun-workdir"  # written last: a copy without it is half-made
STORE_MARK = "snapshot.json"  # beside a store entry's trees (launcher/run/codesnap.py)


def _populate(src: Path, dest: Path) -> None:
    for root, dirs, files in os.walk(src):
        rel = Path(root).relative_to(src)
        (dest / rel).mkdir(exist_ok=True)
        for d in dirs:
            (dest / rel / d).mkdir(exist_ok=True)
        for name in files:
            a, b = Path(root) / name, dest / rel / name
            try:
                os.link(a, b)
            except OSError:
                shutil.copy2(a, b)


def is_store_entry(packed: str | os.PathLike[str]) -> bool:
    """``packed`` is a store entry (``.code/<digest>/project`` beside the
    entry's snapshot.json: launcher/run/codesnap.py's SNAPSHOT_FILE), not the
    live project dir that ``launcher.code=live`` runs."""
    return (Path(packed).parent / STORE_MARK).is_file()


def run_workdir(run_dir: str | os.PathLike[str], packed: str | os.PathLike[str]) -> str:
    """``<run_dir>/workdir``, made from ``packed`` if it is not there yet;
    ``packed`` itself when it is no store entry (a live project dir, which
    may hold the run dir). Made in a temporary dir and renamed into place: a
    task racing another uses whichever copy was renamed first, never a
    half-made one."""
    if not is_store_entry(packed):
        return str(packed)
    dest = Path(run_dir) / WORKDIR
    if (dest / DONE_MARK).exists():
        return str(dest)
    tmp = Path(run_dir) / f".{WORKDIR}.{secrets.token_hex(4)}"
    tmp.mkdir(parents=True)
    try:
        _populate(Path(packed), tmp)
        (tmp / DONE_MARK).write_text(f"{packed}\n")
        try:
            os.rename(tmp, dest)
        except OSError:
            if not (dest / DONE_MARK).exists():  # not another task's complete copy
                raise
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(tmp)
    return str(dest)
