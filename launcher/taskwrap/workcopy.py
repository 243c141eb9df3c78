"""A script job's working directory: the run's own private, writable copy
of the packed project, made from this submission's store entry.

The packed project (launcher/run/codesnap.py) is content-addressed: every
run and sweep point with the same code shares one read-only store entry. A
program that writes beside its code (Lightning's ``lightning_logs/`` and
``hpc_ckpt_N.ckpt`` in the cwd, a ``./outputs`` dir, a config it rewrites)
must not write into that shared entry, nor find another run's files there.
So each run starts its program in ``<run dir>/workdir``:

- **copies, never hard links**: a link shared the store's inode (a non-root
  program could not update a project file in place, as it can in its
  checkout; a root one wrote through into the entry every later run
  reuses). Each file is cloned where the file system can (reflink), copied
  otherwise, with the entry's mode plus the owner's write bit (never wider).
- **from this submission's entry**: the copy's mark (``.meshrun-workdir``,
  written last) names the entry and its files. A continuation submitted
  with changed code finds another entry there: the code files are brought
  to the new entry (changed ones replaced, new ones added, ones the new code
  no longer has removed), the run's own files (anything the old code did
  not have) kept, and the task says so. Before, the old copy was used as it
  was: a fixed bug failed again while the run record named the fix.
- **made once per start** by whichever task gets there first: a fresh copy
  is built aside and renamed into place; an update is made by the task that
  creates ``.workdir.updating`` in the run dir while the others wait for
  the mark to name the new entry. Kept across restarts and requeues, where
  the program finds what it wrote.

Standard library only, as the wrapper."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import sys
import time
from pathlib import Path

WORKDIR = "workdir"
DONE_MARK = ".meshrun-workdir"  # written last: a copy without it is half-made
UPDATING = ".workdir.updating"  # in the run dir while one task updates the copy
STORE_MARK = "snapshot.json"  # beside a store entry's trees (launcher/run/codesnap.py)
WAIT_S = 600.0  # the longest a task waits for another's update (a large tree, a slow file system)
_FICLONE = 0x40049409  # linux/fs.h: share the source's blocks, copy on write


class WorkdirError(RuntimeError):
    """The run's workdir cannot be made from its entry (said, never run from the live tree)."""


def is_store_entry(packed: str | os.PathLike[str]) -> bool:
    """``packed`` is a store entry (``.code/<user>/<digest>/project`` beside
    the entry's snapshot.json: launcher/run/codesnap.py's SNAPSHOT_FILE),
    not the live project dir that ``launcher.code=live`` runs."""
    return (Path(packed).parent / STORE_MARK).is_file()


def entry_files(packed: str | os.PathLike[str]) -> dict[str, str]:
    """The entry's files (relative path -> sha256), from its snapshot.json."""
    meta = json.loads((Path(packed).parent / STORE_MARK).read_text())
    files = meta.get("files")
    if not isinstance(files, dict):
        raise WorkdirError(f"{Path(packed).parent / STORE_MARK} lists no files")
    return files


def _copy_file(src: str, dst: str) -> None:
    """``src`` to ``dst`` (replacing it atomically): cloned where the file
    system shares blocks, else copied; the source's mode plus owner write."""
    tmp = f"{dst}.{secrets.token_hex(4)}.tmp"
    mode = (os.stat(src).st_mode & 0o755) | 0o200
    with open(src, "rb") as a:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with open(fd, "wb") as b:
            try:
                import fcntl

                fcntl.ioctl(b.fileno(), _FICLONE, a.fileno())
            except (OSError, ImportError):
                shutil.copyfileobj(a, b, 1 << 20)
    os.chmod(tmp, mode)
    os.replace(tmp, dst)


def _populate(src: Path, dest: Path, only: set[str] | None = None) -> None:
    """Copy the entry's files (``only``: those relative paths) into ``dest``."""
    for root, dirs, files in os.walk(src):
        rel = Path(root).relative_to(src)
        (dest / rel).mkdir(exist_ok=True)
        for d in dirs:
            (dest / rel / d).mkdir(exist_ok=True)
        for name in files:
            r = (rel / name).as_posix()
            if only is None or r in only:
                _copy_file(os.path.join(root, name), str(dest / rel / name))


def made_from(dest: Path) -> dict | None:
    """The copy's mark: {"entry": path, "files": {rel: sha} or None (a mark
    from before files were listed)}; None when there is no complete copy."""
    try:
        text = (dest / DONE_MARK).read_text()
    except FileNotFoundError:
        return None
    try:
        mark = json.loads(text)
    except ValueError:
        return {"entry": text.strip(), "files": None}
    return mark if isinstance(mark, dict) else {"entry": str(mark), "files": None}


def _write_mark(dest: Path, packed: str, files: dict[str, str]) -> None:
    tmp = dest / f"{DONE_MARK}.{secrets.token_hex(4)}"
    tmp.write_text(json.dumps({"entry": str(packed), "files": files}, sort_keys=True) + "\n")
    os.replace(tmp, dest / DONE_MARK)


def run_workdir(run_dir: str | os.PathLike[str], packed: str | os.PathLike[str]) -> str:
    """``<run_dir>/workdir``, made from ``packed`` (or brought to it from an
    earlier entry); ``packed`` itself when it is no store entry (a live
    project dir, which may hold the run dir)."""
    if not is_store_entry(packed):
        return str(packed)
    dest = Path(run_dir) / WORKDIR
    deadline = time.monotonic() + WAIT_S
    while True:
        mark = made_from(dest)
        if mark is not None and mark.get("entry") == str(packed):
            return str(dest)
        if not dest.exists():
            _fresh(Path(run_dir), dest, Path(packed))
            continue
        if _try_update(Path(run_dir), dest, Path(packed), mark):
            continue
        if time.monotonic() > deadline:
            raise WorkdirError(
                f"{dest} was not brought to {packed} in {WAIT_S:.0f} s (another task's update never "
                f"finished: remove {Path(run_dir) / UPDATING} if no task of this run is alive)"
            )
        time.sleep(0.2)


def _fresh(run_dir: Path, dest: Path, packed: Path) -> None:
    """The first copy: built aside and renamed into place (a task racing
    another uses whichever copy was renamed first, never a half-made one)."""
    files = entry_files(packed)
    tmp = run_dir / f".{WORKDIR}.{secrets.token_hex(4)}"
    tmp.mkdir(parents=True)
    try:
        _populate(packed, tmp)
        _write_mark(tmp, str(packed), files)
        try:
            os.rename(tmp, dest)
        except OSError:
            if made_from(dest) is None:  # not another task's complete copy
                raise
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(tmp)


def _try_update(run_dir: Path, dest: Path, packed: Path, mark: dict | None) -> bool:
    """Bring the copy to ``packed`` if this task gets the update (True when
    it did); False when another task holds it (the caller waits)."""
    lock = run_dir / UPDATING
    try:
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        with contextlib.suppress(OSError):
            if time.time() - lock.stat().st_mtime > WAIT_S:  # its task died mid-update: redo it
                lock.unlink()
        return False
    try:
        os.write(fd, f"{os.getpid()} {packed}\n".encode())
        os.close(fd)
        if made_from(dest) != mark:  # another task finished an update meanwhile
            return True
        mark = mark or {"entry": None, "files": None}  # a copy without its mark: nothing of it removed
        counts = update_copy(dest, packed, mark)
        print(
            f"meshrun: this run's code changed since its workdir was made ({mark['entry']} -> {packed}): "
            f"{counts['updated']} file(s) updated, {counts['added']} added, {counts['removed']} removed; "
            f"the run's own files kept",
            file=sys.stderr,
            flush=True,
        )
        return True
    finally:
        with contextlib.suppress(OSError):
            lock.unlink()


def update_copy(dest: Path, packed: Path, mark: dict) -> dict[str, int]:
    """The copy's code files brought to ``packed``'s (in place: the run's own
    files never move); the mark rewritten last, so an update cut short is
    redone by the next start. Counts of files updated, added, removed."""
    new = entry_files(packed)
    old = mark.get("files")
    if not isinstance(old, dict):  # a mark that lists no files: the old entry's, if it is still there
        try:
            old = entry_files(mark["entry"]) if mark.get("entry") else {}
        except (OSError, ValueError, WorkdirError):
            old = {}  # unknown: nothing is removed, every file of the new code is written
    changed = {r for r, sha in new.items() if old.get(r) != sha or not (dest / r).is_file()}
    added = {r for r in changed if r not in old}
    gone = [r for r in old if r not in new]
    _populate(packed, dest, only=changed)
    for r in gone:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(dest / r)
        with contextlib.suppress(OSError):  # folders the old code alone had, when now empty
            parent = (dest / r).parent
            while parent != dest:
                os.rmdir(parent)
                parent = parent.parent
    _write_mark(dest, str(packed), new)
    return {"updated": len(changed - added), "added": len(added), "removed": len(gone)}


def missing_entry(packed: str, workdir: str) -> WorkdirError:
    """The error for a job whose store entry is gone: never the live tree instead."""
    return WorkdirError(
        f"the run's code snapshot {packed} is gone (removed by `meshrun snapshot --gc`, or the runs root "
        f"moved); resubmit to pack the code again (the live {workdir} is not run in its place)"
    )
