"""The code snapshot store (launcher/run/codesnap.py): hashing, entries,
their verification and who may use or remove them.

Layout: ``<runs_root>/.code/<user>/<digest>/{snapshot.json, .lock, meshrun|project}``.
Each user has an own folder: an entry is used only by the user who owns
it, so nobody can plant code another user's job runs. Modes:

- a private runs root: ``.code`` 0700 (when made here), ``<user>`` and every
  folder of an entry 0700;
- a runs root shared by a group (group-writable with the setgid bit, e.g.
  ``chmod 2770``): ``.code`` 3770 (setgid, sticky: each user makes an own
  folder and nobody can rename another's), ``<user>`` and the entries'
  folders 2750: teammates read (``meshrun diff``), only the owner writes;
- files keep their mode less every write bit (0644 -> 0444, 0600 -> 0400):
  never wider than the source. The digest covers ``mode & 0o555``.

Before an entry is used it is verified: owned by the submitting user,
writable by nobody else, its files exactly those of its manifest
(``snapshot.json``: each file's sha256 and mode), no links. A file's digest
comes from the user's hash cache (``<user>/.hashcache.json``, keyed by size,
mtime, inode and ctime: a file changed since is read again). An entry that
fails is rebuilt, never run.

A submission holds a shared ``flock`` on each entry it uses until it exits,
and one that reuses an entry leaves a use mark (``<user>/.used/<digest>``).
A refused submission removes an entry only when it made it, no other
process holds it and no mark says another submission used it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import pwd
import re
import secrets
import shutil
import stat
from pathlib import Path
from typing import Any

from launcher.config.validate import ConfigError
from launcher.run.codewalk import SNAPSHOT_FILE, Tree, included

HASH_CACHE = ".hashcache.json"
DATA_CACHE = ".datacache.json"  # launcher/run/record.py: data files' digests, per user as the hash cache
LOCK_FILE = ".lock"
USED_DIR = ".used"
# A PEM private key (also inside JSON: a service-account key's "\n").
PRIVATE_KEY = re.compile(rb"-----BEGIN [A-Z ]*PRIVATE KEY-----(\\n|\r?\n)")
_TAIL = 64  # bytes kept between blocks: a key header split across two blocks is still found


def user_name() -> str:
    try:
        name = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        name = ""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name) or f"uid{os.getuid()}"


def shared_root(runs_root: Path) -> bool:
    """A runs root a group shares: group-writable with the setgid bit."""
    try:
        mode = os.stat(runs_root).st_mode
    except OSError:
        return False
    return bool(mode & stat.S_ISGID and mode & stat.S_IWGRP)


def private(st: os.stat_result) -> bool:
    """Owned by this user and writable by nobody else."""
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


def read_private_json(path: Path) -> dict[str, Any]:
    """A cache file's dict; {} when missing, unreadable, not a dict, not this
    user's or writable by others (then rebuilt, never trusted: another user
    who can write the runs root could steer a recorded digest)."""
    try:
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode) and private(st):
            doc = json.loads(path.read_text())
            return doc if isinstance(doc, dict) else {}
    except (OSError, ValueError):
        pass
    return {}


def write_private_json(path: Path, doc: dict[str, Any]) -> None:
    """``doc`` to ``path``, 0600, replaced whole (a reader never sees half of it)."""
    tmp = path.with_name(f"{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with open(fd, "w") as f:
        f.write(json.dumps(doc))
    os.replace(tmp, path)


class HashCache:
    """File digests by (path, size, mtime_ns, inode, ctime_ns): a file
    unchanged since the last submission is not read again. Read only when
    the file is this user's and writable by nobody else."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.entries: dict[str, list[Any]] = {}
        self.changed = False
        if path is not None:
            self.entries = read_private_json(path)

    def lookup(self, path: str, st: os.stat_result | None = None) -> tuple[str, bool, int]:
        """(sha256, holds a private key, mode); special files refused (a FIFO would block)."""
        st = st or os.stat(path)
        key = [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]
        hit = self.entries.get(path)
        if hit is not None and hit[:4] == key and stat.S_ISREG(st.st_mode):
            return str(hit[4]), bool(hit[5]), st.st_mode
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        with open(fd, "rb") as f:
            fst = os.fstat(f.fileno())
            if not stat.S_ISREG(fst.st_mode):
                raise ConfigError(
                    f"{path} is not a regular file (a FIFO, socket or device): it is not packed"
                )
            h, found, tail = hashlib.sha256(), False, b""
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
                found = found or PRIVATE_KEY.search(tail + block) is not None
                tail = block[-_TAIL:]
        key = [fst.st_size, fst.st_mtime_ns, fst.st_ino, fst.st_ctime_ns]
        self.entries[path] = [*key, h.hexdigest(), int(found)]
        self.changed = True
        return h.hexdigest(), found, fst.st_mode

    def digest(self, path: str) -> str:
        return self.lookup(path)[0]

    def save(self) -> None:
        if self.path is None or not self.changed:
            return
        write_private_json(self.path, self.entries)
        self.changed = False


def hash_tree(tree: Tree, cache: HashCache, scan: bool = True) -> str:
    """The tree's digest: sha256 over each file's path, mode & 0o555 and
    content digest. ``scan``: a file holding a private key is left out
    (named in ``tree.left_out``) unless ``launcher.code_include`` names it."""
    h = hashlib.sha256()
    kept: list[tuple[str, int]] = []
    for rel, size in tree.files:
        digest, secret, mode = cache.lookup(os.path.join(tree.root, rel))
        if scan and secret and not included(rel, tree.include):
            if (rel, "holds a private key") not in tree.left_out:
                tree.left_out.append((rel, "holds a private key"))
            continue
        tree.hashes[rel], tree.modes[rel] = digest, mode & 0o555
        h.update(f"{rel}\0{mode & 0o555:o}\0{digest}\n".encode())
        kept.append((rel, size))
    tree.files = kept
    tree.digest = h.hexdigest()
    return tree.digest


def manifest_digest(files: dict[str, str], modes: dict[str, int]) -> str:
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(f"{rel}\0{modes[rel]:o}\0{files[rel]}\n".encode())
    return h.hexdigest()


def user_store(store: Path) -> Path:
    """``<store>/<user>`` (where this user's entries and hash cache live)."""
    return store / user_name()


def dir_mode(store: Path) -> int:
    return 0o2750 if shared_root(store.parent) else 0o700


def ensure_user_store(store: Path) -> Path:
    """Make (or check) ``<store>/<user>``: this user's, writable by nobody else."""
    runs_root = store.parent
    try:
        runs_root.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            store.mkdir()
            os.chmod(store, 0o3770 if shared_root(runs_root) else 0o700)
        udir = user_store(store)
        with contextlib.suppress(FileExistsError):
            udir.mkdir()
            os.chmod(udir, dir_mode(store))
    except PermissionError as e:
        raise ConfigError(
            f"launcher.runs_root={str(runs_root)!r}: the code store {e.filename} cannot be written "
            f"({e.strerror}); use a runs root you can write, or ask its owner to make it group-shared (chmod 2770)"
        ) from e
    st = os.lstat(udir)
    if not stat.S_ISDIR(st.st_mode) or not private(st):
        owner = _owner(st.st_uid)
        raise ConfigError(
            f"launcher.runs_root={str(runs_root)!r}: the code store {udir} is owned by {owner} or writable by "
            "others, so another user could plant the code your jobs run; it is not used. Ask its owner or an "
            "admin to remove it, or use another launcher.runs_root"
        )
    return udir


def _owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def verify_entry(entry: Path, digest: str, kind: str, cache: HashCache) -> str | None:
    """Why the entry must not be used, or None: owned by this user and
    writable by nobody else, exactly its manifest's files with their
    digests and modes, no links."""
    try:
        if not private(os.lstat(entry)):
            return f"{entry} is not yours or is writable by others"
        mst = os.lstat(entry / SNAPSHOT_FILE)
        if not stat.S_ISREG(mst.st_mode) or not private(mst):
            return f"{entry / SNAPSHOT_FILE} is not yours or is writable"
        meta = json.loads((entry / SNAPSHOT_FILE).read_text())
        files, modes = meta.get("files") or {}, meta.get("modes")
        if meta.get("digest") != digest or meta.get("kind") != kind or not isinstance(modes, dict):
            return "its snapshot.json names another digest or kind (or no modes)"
        if set(files) != set(modes) or manifest_digest(files, modes) != digest:
            return "its manifest does not give its digest"
        kst = os.lstat(entry / kind)
        if not stat.S_ISDIR(kst.st_mode) or not private(kst):
            return f"{entry / kind} is a link, not yours or writable by others"
        seen: set[str] = set()
        why = _verify_dir(str(entry / kind), "", files, modes, cache, seen)
        if why is None and seen != set(files):
            why = f"{len(set(files) - seen)} files missing, {len(seen - set(files))} not in its manifest"
        return why
    except (OSError, ValueError, ConfigError) as e:
        return str(e)


def _verify_dir(
    top: str, prefix: str, files: dict[str, str], modes: dict[str, int], cache: HashCache, seen: set[str]
) -> str | None:
    """One folder of an entry (scandir: one lstat per file, no path arithmetic)."""
    uid = os.getuid()
    with os.scandir(os.path.join(top, prefix) if prefix else top) as it:
        for d in it:
            rel = prefix + d.name
            st = d.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                if not private(st):
                    return f"{rel}/ is not yours or is writable by others"
                why = _verify_dir(top, rel + "/", files, modes, cache, seen)
                if why:
                    return why
                continue
            if not stat.S_ISREG(st.st_mode) or st.st_uid != uid or st.st_mode & 0o222:
                return f"{rel} is not a read-only file of yours (a link, or writable)"
            sha, _, mode = cache.lookup(d.path, st)
            if files.get(rel) != sha or modes.get(rel) != mode & 0o555:
                return f"{rel} differs from its manifest"
            seen.add(rel)
    return None


# Entries this process holds a shared lock on (until it exits): entry -> fd.
_HELD: dict[str, int] = {}


def hold(entry: Path) -> bool:
    """Take a shared lock on the entry (it is in use); False when it has
    no lock file or was moved away while we waited."""
    key = str(entry)
    if key in _HELD:
        return True
    try:
        fd = os.open(entry / LOCK_FILE, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    fcntl.flock(fd, fcntl.LOCK_SH)
    try:
        same = os.lstat(entry / LOCK_FILE).st_ino == os.fstat(fd).st_ino
    except OSError:
        same = False
    if not same:  # removed by a refused submission while we waited: not there any more
        os.close(fd)
        return False
    _HELD[key] = fd
    return True


def release(entry: Path) -> None:
    fd = _HELD.pop(str(entry), None)
    if fd is not None:
        os.close(fd)


def mark_used(udir: Path, digest: str) -> None:
    """Say that a submission reused ``digest``: a refused one that made it leaves it."""
    used = udir / USED_DIR
    with contextlib.suppress(FileExistsError):
        used.mkdir(mode=0o700)
    (used / digest).touch()


def discard(entry: Path) -> None:
    """Move the entry out of the way, then remove it (a reader never sees half of one)."""
    trash = entry.with_name(f".trash-{entry.name[:16]}-{secrets.token_hex(4)}")
    try:
        os.rename(entry, trash)
    except FileNotFoundError:
        return
    shutil.rmtree(trash, onerror=_writable_then_retry)


def undo_entry(entry: Path) -> bool:
    """Remove an entry a refused submission made, when nobody else uses it:
    no other process holds it and no use mark. True when removed."""
    fd = _HELD.get(str(entry))
    if fd is None:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False  # another submission holds it
    if (entry.parent / USED_DIR / entry.name).exists():
        fcntl.flock(fd, fcntl.LOCK_SH)
        return False  # reused by a submission that has finished: its job may need it
    discard(entry)
    release(entry)
    return True


def _writable_then_retry(func: Any, path: str, _exc: Any) -> None:
    os.chmod(os.path.dirname(path), 0o700)
    func(path)


def copy_tree(tree: Tree, dest: Path, cache: HashCache, dmode: int) -> Tree:
    """Copy ``tree`` into ``dest``: each file with its mode less write bits,
    folders ``dmode``; the copy's digest (a file edited since it was hashed
    gives the copy's content, not a mix)."""
    dirs = {dest}
    for rel, _ in tree.files:
        target = dest / rel
        for parent in reversed(target.relative_to(dest).parents[:-1]):
            if dest / parent not in dirs:
                (dest / parent).mkdir(exist_ok=True)
                dirs.add(dest / parent)
        src = os.open(os.path.join(tree.root, rel), os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        with open(src, "rb") as fin:
            mode = os.fstat(fin.fileno()).st_mode
            if not stat.S_ISREG(mode):
                raise ConfigError(f"{os.path.join(tree.root, rel)} is no longer a regular file: not packed")
            out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with open(out, "wb") as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
        os.chmod(target, mode & 0o555)
    for d in dirs:
        os.chmod(d, dmode)
    copied = Tree(root=str(dest), files=list(tree.files))
    hash_tree(copied, cache, scan=False)
    return copied
