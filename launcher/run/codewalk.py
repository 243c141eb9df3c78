"""Which files a code snapshot packs (launcher/run/codesnap.py): the tree walk.

In a git checkout the files are git's (tracked and untracked, ignored ones
left out); outside git every file under the tops. Either way:

- a symlink is followed: a linked file or folder is packed with the content
  it points to now (so a change behind ``configs -> /shared/configs`` changes
  the digest); a link back into a folder being walked (a cycle) and a
  dangling link are skipped and named;
- a submodule or a nested git repository is listed by its own git, with the
  same rule;
- special files (FIFOs, sockets, devices) are skipped and named: opening a
  FIFO would block the submission;
- the runs root and any ``.code`` store are always left out (a default
  ``runs/`` inside the project would otherwise pack every earlier run);
- files that look like credentials are left out and named unless
  ``launcher.code_include`` names them (:func:`credential_name`; private
  keys found by content are dropped when hashed, launcher/run/codestore.py).
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.config.secrets import mask
from launcher.config.validate import ConfigError

STORE_DIR = ".code"
SNAPSHOT_FILE = "snapshot.json"
SKIP_DIRS = {"__pycache__", ".git", ".pytest_cache", ".ruff_cache", ".mypy_cache", STORE_DIR}
# Folders whose every file is a credential store (SSH, cloud CLIs, GnuPG).
SECRET_DIRS = {".ssh", ".aws", ".gnupg", ".azure", ".kube", ".docker", ".gcloud"}
# File names (case-insensitive globs) that hold credentials by convention.
SECRET_NAMES = (
    ".env",
    ".env.*",
    "*.env",
    ".envrc",
    ".netrc",
    "_netrc",
    ".pgpass",
    ".git-credentials",
    ".pypirc",
    "*credentials*",
    "id_rsa",
    "id_dsa",
    "id_ecdsa",
    "id_ed25519",
    "*.key",
    "*.p12",
    "*.pfx",
    "*.keystore",
)


@dataclass
class Tree:
    """One source tree as it would be packed: its files and what git says."""

    root: str
    files: list[tuple[str, int]]  # (path relative to root, size)
    digest: str = ""
    git: dict[str, Any] = field(default_factory=dict)  # {} outside git
    hashes: dict[str, str] = field(default_factory=dict)  # rel path -> sha256
    modes: dict[str, int] = field(default_factory=dict)  # rel path -> mode & 0o555 (what the copy gets)
    left_out: list[tuple[str, str]] = field(default_factory=list)  # (rel path, why), named in the dry run
    include: tuple[str, ...] = ()  # launcher.code_include entries relative to root

    @property
    def bytes(self) -> int:
        return sum(size for _, size in self.files)


def credential_name(rel: str) -> str | None:
    """Why ``rel`` is taken for a credential by its name, or None."""
    parts = rel.split("/")
    hit = next((p for p in parts[:-1] if p in SECRET_DIRS), None)
    if hit:
        return f"in {hit}/ (credentials)"
    name = parts[-1].lower()
    if name.endswith(".pub") or name in {".env.example", ".env.sample", ".env.template"}:
        return None
    pattern = next((p for p in SECRET_NAMES if fnmatch.fnmatchcase(name, p)), None)
    return f"named like a credential ({pattern})" if pattern else None


def included(rel: str, include: tuple[str, ...]) -> bool:
    """``rel`` is, or is under, a ``launcher.code_include`` path."""
    return any(rel == inc or rel.startswith(inc.rstrip("/") + "/") for inc in include)


def _git(root: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", root, *args], capture_output=True, timeout=60, check=False)


def stored_info(root: str) -> dict[str, Any] | None:
    """The snapshot.json of a store entry when ``root`` is one's code tree
    (``.code/<user>/<digest>/<kind>``, or the older ``.code/<digest>/<kind>``)."""
    entry = Path(root).parent
    meta = entry / SNAPSHOT_FILE
    if STORE_DIR not in (entry.parent.name, entry.parent.parent.name) or not meta.is_file():
        return None
    try:
        return json.loads(meta.read_text())
    except (OSError, ValueError):
        return None


def in_git(root: str) -> bool:
    if shutil.which("git") is None or stored_info(root) is not None:
        return False
    return _git(root, "rev-parse", "--show-toplevel").returncode == 0


class Walker:
    """Collects (rel, size) and what was left out, following symlinks."""

    def __init__(self, root: str, exclude: tuple[str, ...], include: tuple[str, ...]) -> None:
        self.root = root
        # Only what lies inside the tree: a project kept under the runs root
        # (runs_root=/scratch/me, project /scratch/me/proj) is packed, whole.
        top = os.path.realpath(root)
        self.exclude = {e for e in map(os.path.realpath, exclude) if e.startswith(top + os.sep)}
        self.include = include
        self.files: dict[str, int] = {}
        self.left_out: list[tuple[str, str]] = []

    def add(self, rel: str, chain: tuple[str, ...] = ()) -> None:
        """One path (relative to root): a file, a folder (walked), a link (followed)."""
        full = os.path.join(self.root, rel)
        try:
            lst = os.lstat(full)
            st = os.stat(full) if stat.S_ISLNK(lst.st_mode) else lst
        except FileNotFoundError:
            if os.path.islink(full):
                self.left_out.append((rel, "a dangling symlink"))
            return  # a tracked file deleted in the work tree: the diff says so
        if stat.S_ISREG(st.st_mode) and not rel.endswith((".pyc", ".pyo")):
            why = credential_name(rel)
            if why and not included(rel, self.include):
                self.left_out.append((rel, why))
            else:
                self.files[rel] = st.st_size
            return
        real = os.path.realpath(full)  # folders and links only: the common case stays one lstat
        if real in self.exclude or any(real.startswith(e + os.sep) for e in self.exclude):
            return  # the runs root (and its store): never packed
        if stat.S_ISDIR(st.st_mode):
            if real in chain:
                self.left_out.append((rel, "a symlink cycle"))
            elif (
                not stat.S_ISLNK(lst.st_mode) and os.path.lexists(os.path.join(full, ".git")) and in_git(full)
            ):
                self.git_repo(rel, None, (*chain, real))  # a submodule or nested repository: its git's files
            else:
                self.walk(rel, (*chain, real))
        elif not stat.S_ISREG(st.st_mode):
            self.left_out.append((rel, f"a special file ({_kind(st.st_mode)}), skipped"))

    def walk(self, rel: str, chain: tuple[str, ...]) -> None:
        full = os.path.join(self.root, rel)
        try:
            names = sorted(os.listdir(full))
        except OSError as e:
            self.left_out.append((rel, f"unreadable ({e.strerror})"))
            return
        for name in names:
            if name in SKIP_DIRS and os.path.isdir(os.path.join(full, name)):
                continue
            self.add(os.path.normpath(os.path.join(rel, name)), chain)

    def git_repo(self, rel: str, paths: tuple[str, ...] | None, chain: tuple[str, ...]) -> None:
        """A git repository at ``rel`` (the top, a submodule, a nested repo): git's files."""
        full = os.path.join(self.root, rel)
        res = _git(full, "ls-files", "-co", "--exclude-standard", "-z", "--", *(paths or ()))
        if res.returncode:
            raise ConfigError(f"git ls-files failed in {full}: {res.stderr.decode(errors='replace').strip()}")
        here = os.path.realpath(full)
        # The runs root under this repository (untracked, not ignored): its files are never listed.
        skip = tuple(os.path.relpath(e, here) + "/" for e in self.exclude if e.startswith(here + os.sep))
        for name in sorted({n.rstrip("/") for n in res.stdout.decode().split("\0") if n}):
            if STORE_DIR in name.split("/") or (name + "/").startswith(skip):
                continue
            self.add(os.path.normpath(os.path.join(rel, name)), chain)


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a file"


def walk_tree(
    root: str,
    tops: tuple[str, ...],
    files: tuple[str, ...],
    exclude: tuple[str, ...],
    include: tuple[str, ...],
) -> tuple[list[tuple[str, int]], list[tuple[str, str]]]:
    """(files with sizes, left out with why) under ``root``'s ``tops`` and ``files``."""
    w = Walker(root, exclude, include)
    here = (os.path.realpath(root),)
    if in_git(root):
        present = tuple(p for p in (*tops, *files) if os.path.lexists(os.path.join(root, p)))
        if present:
            w.git_repo(".", present, here)
    else:
        for top in (*tops, *files):
            if top == ".":
                w.walk(".", here)
            elif os.path.lexists(os.path.join(root, top)):
                w.add(os.path.normpath(top), here)
    return sorted(w.files.items()), sorted(set(w.left_out))


def git_state(root: str, paths: tuple[str, ...], leave_out: set[str]) -> dict[str, Any]:
    """commit, branch, dirty and the diff of uncommitted changes (of ``paths``),
    the diff scanned for credentials (a finding masked, said in ``diff_redacted``)
    and without the files left out as credentials."""
    head = _git(root, "rev-parse", "HEAD")
    branch = _git(root, "rev-parse", "--abbrev-ref", "HEAD")
    status = _git(root, "status", "--porcelain", "-z", "--", *paths)
    diff = _git(root, "diff", "HEAD", "--", *paths) if head.returncode == 0 else None
    untracked = _git(root, "ls-files", "-o", "--exclude-standard", "-z", "--", *paths)
    text, redacted = scan_diff(diff.stdout.decode(errors="replace") if diff is not None else "", leave_out)
    return {
        "commit": head.stdout.decode().strip() if head.returncode == 0 else None,
        "branch": branch.stdout.decode().strip() if branch.returncode == 0 else None,
        "dirty": bool(status.stdout.strip()),
        "diff": text,
        "diff_redacted": redacted,
        "untracked": sorted(n for n in untracked.stdout.decode().split("\0") if n),
    }


def scan_diff(diff: str, leave_out: set[str]) -> tuple[str, list[str]]:
    """The diff with the blocks of left-out files dropped and every
    credential-looking value masked (launcher/config/secrets.py's scanners);
    what was done, one entry per file."""
    out: list[str] = []
    said: list[str] = []
    current, dropped = "", False
    for line in diff.splitlines(keepends=True):
        if line.startswith("diff --git "):
            current = line.rstrip("\n").split(" b/", 1)[-1]
            dropped = current in leave_out or credential_name(current) is not None
            if dropped:
                said.append(f"{current}: left out (a credentials file)")
        if dropped:
            continue
        masked = mask(line)
        if masked != line:
            line = masked
            note = f"{current}: a credential masked"
            if note not in said:
                said.append(note)
        out.append(line)
    return "".join(out), said
