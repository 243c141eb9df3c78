"""The code a run runs: packed at submission into a content-addressed store.

``launcher.code=snapshot`` (the default) copies the meshrun code this
launcher was imported from (launcher/, train/, hydra_plugins/, conf/,
pyproject.toml: what a job imports and composes) into
``<runs_root>/.code/<digest>/meshrun/``, once per distinct content: every
point of a sweep and every run with the same code share one copy. The Slurm
job puts that copy on ``PYTHONPATH`` (or mounts it in the container), so a
job waiting in the queue, each requeue and each restart run the code as it
was submitted, whatever the checkout holds later.

In a git checkout the files are git's (``git ls-files -co --exclude-standard``:
tracked and untracked, ignored ones left out) and the commit, branch, dirty
flag and the diff of uncommitted changes are recorded; outside git the
package directories are walked (``__pycache__`` and ``*.pyc`` left out). The
digest covers each file's path, executable bit and content only, so a
snapshot of a snapshot has the same digest (``meshrun rerun``).

Files are hashed once per (size, mtime_ns, inode) (``.code/.hashcache.json``),
so a repeated submission reads only what changed. A store entry is written
into a temporary directory, its files made read-only, then renamed into
place: a reader never sees half a snapshot, and two submissions racing for
the same digest both end with one complete copy.

``launcher.code=clean`` refuses a tree with uncommitted changes; ``live``
runs the checkout (today's behaviour, said in the dry run and the run
record). A job kind that runs a team's program (``job.kind=script``) gets its
project dir (``job.workdir``) packed the same way as a second tree
(``CodeSnapshot.project_dir``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.config.schema import RunConfig
from launcher.config.spec import RunSpec
from launcher.config.validate import ConfigError, fail

# What a job imports and composes (render.py's CODE_DIR holds them).
PACKAGES = ("launcher", "train", "hydra_plugins", "conf")
TOP_FILES = ("pyproject.toml",)
STORE_DIR = ".code"
SNAPSHOT_FILE = "snapshot.json"
HASH_CACHE = ".hashcache.json"
SKIP_DIRS = {"__pycache__", ".git", ".pytest_cache", ".ruff_cache", ".mypy_cache"}
MB = 1 << 20


@dataclass
class Tree:
    """One source tree as it would be packed: its files and what git says."""

    root: str
    files: list[tuple[str, int]]  # (path relative to root, size)
    digest: str = ""
    git: dict[str, Any] = field(default_factory=dict)  # {} outside git
    hashes: dict[str, str] = field(default_factory=dict)  # rel path -> sha256

    @property
    def bytes(self) -> int:
        return sum(size for _, size in self.files)


@dataclass
class CodeSnapshot:
    """What a run runs: ``meshrun_dir`` is put on the job's PYTHONPATH."""

    digest: str
    meshrun_dir: str
    project_dir: str | None = None
    mode: str = "snapshot"
    copied: bool = False
    source: str = ""
    files: int = 0
    bytes: int = 0
    git: dict[str, Any] = field(default_factory=dict)
    project: dict[str, Any] | None = None
    created: list[str] = field(default_factory=list)  # store entries made by this submission

    def record(self) -> dict[str, Any]:
        """The run record's ``code`` entry."""
        return {
            "mode": self.mode,
            "digest": self.digest,
            "dir": self.meshrun_dir,
            "copied": self.copied,
            "source": self.source,
            "files": self.files,
            "bytes": self.bytes,
            "git": self.git,
            "project": self.project,
        }


def code_root() -> str:
    """The meshrun code this launcher runs from (render.py's CODE_DIR)."""
    return str(Path(__file__).resolve().parents[2])


def _git(root: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", root, *args], capture_output=True, timeout=60, check=False)


def _stored_info(root: str) -> dict[str, Any] | None:
    """The snapshot.json of a store entry when ``root`` is one's code tree."""
    meta = Path(root).parent / SNAPSHOT_FILE
    if Path(root).parent.parent.name != STORE_DIR or not meta.is_file():
        return None
    try:
        return json.loads(meta.read_text())
    except (OSError, ValueError):
        return None


def _in_git(root: str) -> bool:
    if shutil.which("git") is None or _stored_info(root) is not None:
        return False
    top = _git(root, "rev-parse", "--show-toplevel")
    return top.returncode == 0


def _walk(root: str, tops: tuple[str, ...], files: tuple[str, ...]) -> list[str]:
    out = [f for f in files if os.path.isfile(os.path.join(root, f))]
    for top in tops:
        for dirpath, dirnames, names in os.walk(os.path.join(root, top)):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            rel = os.path.relpath(dirpath, root)
            out += [os.path.normpath(os.path.join(rel, n)) for n in names if not n.endswith((".pyc", ".pyo"))]
    return out


def _git_files(root: str, paths: tuple[str, ...]) -> list[str]:
    res = _git(root, "ls-files", "-co", "--exclude-standard", "-z", "--", *paths)
    if res.returncode:
        raise ConfigError(f"git ls-files failed in {root}: {res.stderr.decode(errors='replace').strip()}")
    names = sorted({n for n in res.stdout.decode().split("\0") if n})
    # Tracked files deleted in the work tree are not part of the code.
    return [n for n in names if os.path.isfile(os.path.join(root, n))]


def git_state(root: str, paths: tuple[str, ...]) -> dict[str, Any]:
    """commit, branch, dirty and the diff of uncommitted changes (of ``paths``)."""
    head = _git(root, "rev-parse", "HEAD")
    branch = _git(root, "rev-parse", "--abbrev-ref", "HEAD")
    status = _git(root, "status", "--porcelain", "-z", "--", *paths)
    diff = _git(root, "diff", "HEAD", "--", *paths) if head.returncode == 0 else None
    untracked = _git(root, "ls-files", "-o", "--exclude-standard", "-z", "--", *paths)
    return {
        "commit": head.stdout.decode().strip() if head.returncode == 0 else None,
        "branch": branch.stdout.decode().strip() if branch.returncode == 0 else None,
        "dirty": bool(status.stdout.strip()),
        "diff": diff.stdout.decode(errors="replace") if diff is not None else "",
        "untracked": sorted(n for n in untracked.stdout.decode().split("\0") if n),
    }


# Listings by (root, tops, files) for this process: a sweep's points list once.
_TREES: dict[tuple[str, tuple[str, ...], tuple[str, ...]], Tree] = {}


def list_tree(root: str, tops: tuple[str, ...] = PACKAGES, files: tuple[str, ...] = TOP_FILES) -> Tree:
    """The files ``root`` would pack, with their sizes, and git's state
    (listed once per process: one command submits one version of the code)."""
    root = str(Path(root).resolve())
    key = (root, tops, files)
    if key not in _TREES:
        _TREES[key] = _list_tree(root, tops, files)
    t = _TREES[key]
    return Tree(root=t.root, files=list(t.files), git=dict(t.git))


def _list_tree(root: str, tops: tuple[str, ...], files: tuple[str, ...]) -> Tree:
    stored = _stored_info(root)
    if _in_git(root):
        names = _git_files(root, (*tops, *files))
        git = git_state(root, (*tops, *files))
    else:
        names = sorted(_walk(root, tops, files))
        git = dict((stored or {}).get("git") or {})
    listed = [(n, os.path.getsize(os.path.join(root, n))) for n in names]
    return Tree(root=root, files=listed, git=git)


class HashCache:
    """File digests by (path, size, mtime_ns, inode): a file unchanged since
    the last submission is not read again."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.entries: dict[str, list[Any]] = {}
        self.changed = False
        if path is not None and path.is_file():
            try:
                self.entries = json.loads(path.read_text())
            except (OSError, ValueError):
                self.entries = {}

    def digest(self, path: str) -> str:
        st = os.stat(path)
        key = [st.st_size, st.st_mtime_ns, st.st_ino]
        hit = self.entries.get(path)
        if hit is not None and hit[:3] == key:
            return str(hit[3])
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        self.entries[path] = [*key, h.hexdigest()]
        self.changed = True
        return h.hexdigest()

    def save(self) -> None:
        if self.path is None or not self.changed:
            return
        tmp = self.path.with_name(f"{self.path.name}.{secrets.token_hex(4)}.tmp")
        tmp.write_text(json.dumps(self.entries))
        os.replace(tmp, self.path)


# One cache per store for this process: a sweep's points hash once.
_CACHES: dict[str, HashCache] = {}


def _cache(store: Path) -> HashCache:
    """Read from ``<store>/.hashcache.json`` when it exists; saved only once a snapshot is stored."""
    key = str(store)
    if key not in _CACHES:
        _CACHES[key] = HashCache(store / HASH_CACHE)
    return _CACHES[key]


def hash_tree(tree: Tree, cache: HashCache) -> str:
    """The tree's digest: sha256 over each file's path, executable bit and content digest."""
    h = hashlib.sha256()
    for rel, _ in tree.files:
        full = os.path.join(tree.root, rel)
        tree.hashes[rel] = cache.digest(full)
        exe = "x" if os.access(full, os.X_OK) else "-"
        h.update(f"{rel}\0{exe}\0{tree.hashes[rel]}\n".encode())
    tree.digest = h.hexdigest()
    return tree.digest


def store_root(cfg: RunConfig) -> Path:
    return Path(cfg.launcher.runs_root).resolve() / STORE_DIR


def check_tree(cfg: RunConfig, tree: Tree, what: str = "the meshrun code") -> None:
    """Refuse (before anything is written) a tree over the size limit, or a
    dirty one under ``launcher.code=clean``."""
    lc = cfg.launcher
    limit = lc.code_max_mb * MB
    if lc.code != "live" and tree.bytes > limit:
        big = sorted(tree.files, key=lambda f: -f[1])[:3]
        largest = ", ".join(f"{n} ({s / MB:.1f} MB)" for n, s in big)
        raise fail(
            "launcher.code_max_mb",
            lc.code_max_mb,
            f"launcher.code={lc.code} would pack {len(tree.files)} files, {tree.bytes / MB:.1f} MB of {what} "
            f"from {tree.root} (largest: {largest}); list them with `meshrun snapshot --list`, leave "
            "files out with .gitignore, raise launcher.code_max_mb, or use launcher.code=live",
        )
    if lc.code == "clean" and tree.git.get("dirty"):
        changed = [*_changed_files(tree.git.get("diff", "")), *tree.git.get("untracked", [])]
        raise fail(
            "launcher.code",
            lc.code,
            f"{what} in {tree.root} has uncommitted changes ({', '.join(changed[:5]) or 'see git status'}"
            f"{', ...' if len(changed) > 5 else ''}); commit them, or use launcher.code=snapshot "
            "(records the diff) or live (choose one of snapshot, live, clean)",
        )


def _changed_files(diff: str) -> list[str]:
    return [line.split(" b/", 1)[-1] for line in diff.splitlines() if line.startswith("diff --git ")]


def _project_root(cfg: RunConfig) -> str | None:
    """A script job's project dir (``job.workdir``, added with job.kind=script)."""
    if getattr(cfg.job, "kind", "") != "script":
        return None
    return str(getattr(cfg.job, "workdir", "") or "") or None


def plan_code(cfg: RunConfig) -> tuple[Tree, Tree | None]:
    """The trees a run would pack, hashed and checked; writes nothing.
    Refusals are :class:`ConfigError` naming the field."""
    store = store_root(cfg)
    cache = _cache(store)
    tree = list_tree(code_root())
    check_tree(cfg, tree)
    hash_tree(tree, cache)
    project = None
    root = _project_root(cfg)
    if root is not None:
        project = list_tree(root, tops=(".",), files=())
        check_tree(cfg, project, what="the project dir (job.workdir)")
        hash_tree(project, cache)
    return tree, project


def _copy_tree(tree: Tree, dest: Path) -> Tree:
    """Copy ``tree`` into ``dest`` (read-only files); the digest of the copy
    (a file edited since it was hashed gives the copy's content, not a mix)."""
    copied = Tree(root=str(dest), files=tree.files)
    for rel, _ in tree.files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(os.path.join(tree.root, rel), target)
        exe = os.access(os.path.join(tree.root, rel), os.X_OK)
        os.chmod(target, 0o555 if exe else 0o444)
    hash_tree(copied, HashCache(None))
    return copied


def store_tree(tree: Tree, store: Path, kind: str) -> tuple[str, bool]:
    """``<store>/<digest>/<kind>`` holding ``tree``; (its path, copied now).
    Written into a temporary directory and renamed into place."""
    entry = store / tree.digest
    if (entry / SNAPSHOT_FILE).is_file():
        return str(entry / kind), False
    store.mkdir(parents=True, exist_ok=True)
    tmp = store / f".tmp-{tree.digest[:16]}-{secrets.token_hex(4)}"
    try:
        (tmp / kind).mkdir(parents=True)  # an empty tree (a workdir with no files) is a snapshot too
        copied = _copy_tree(tree, tmp / kind)
        if copied.digest != tree.digest:  # edited while being copied: the copy's content is what runs
            tree.digest, tree.hashes = copied.digest, copied.hashes
            entry = store / tree.digest
            if (entry / SNAPSHOT_FILE).is_file():
                return str(entry / kind), False
        meta = {
            "digest": tree.digest,
            "kind": kind,
            "source": tree.root,
            "git": tree.git,
            "files": tree.hashes,
        }
        (tmp / SNAPSHOT_FILE).write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
        os.chmod(tmp / SNAPSHOT_FILE, 0o444)
        try:
            os.rename(tmp, entry)
        except OSError:
            if not (entry / SNAPSHOT_FILE).is_file():  # not a lost race: a real failure
                raise
            return str(entry / kind), False
        return str(entry / kind), True
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, onerror=_writable_then_retry)


def _writable_then_retry(func: Any, path: str, _exc: Any) -> None:
    os.chmod(os.path.dirname(path), 0o755)
    func(path)


def _tree_record(tree: Tree) -> dict[str, Any]:
    return {
        "source": tree.root,
        "digest": tree.digest,
        "files": len(tree.files),
        "bytes": tree.bytes,
        "git": tree.git,
    }


def _copies(cfg: RunConfig) -> bool:
    return cfg.launcher.code != "live" and cfg.cluster.kind == "slurm"


def plan_snapshot(cfg: RunConfig) -> CodeSnapshot:
    """What :func:`snapshot_run` would give, written nowhere (the dry run,
    prepare's checks): ``meshrun_dir`` is where the store holds (or would
    hold) the copy. Raises :class:`ConfigError` for a refused tree."""
    tree, project = plan_code(cfg)
    store = store_root(cfg)
    copy = _copies(cfg)
    return CodeSnapshot(
        digest=tree.digest,
        meshrun_dir=str(store / tree.digest / "meshrun") if copy else tree.root,
        project_dir=(str(store / project.digest / "project") if copy else project.root) if project else None,
        mode=cfg.launcher.code,
        source=tree.root,
        files=len(tree.files),
        bytes=tree.bytes,
        git=tree.git,
        project=_tree_record(project) if project is not None else None,
    )


def snapshot_run(spec: RunSpec) -> CodeSnapshot:
    """The code ``spec`` runs. ``launcher.code=snapshot|clean`` on Slurm: the
    store's copy (made now unless one with this digest exists); local runs
    and ``live``: the checkout itself, its digest and git state recorded.
    Raises :class:`ConfigError` (nothing written) for a refused tree."""
    cfg = spec.cfg
    snap = plan_snapshot(cfg)
    if not _copies(cfg):
        return snap
    tree, project = plan_code(cfg)
    store = store_root(cfg)
    snap.meshrun_dir, snap.copied = store_tree(tree, store, "meshrun")
    snap.digest = tree.digest
    if snap.copied:
        snap.created.append(str(Path(snap.meshrun_dir).parent))
    if project is not None:
        snap.project_dir, made = store_tree(project, store, "project")
        snap.project = _tree_record(project)
        if made:
            snap.created.append(str(Path(snap.project_dir).parent))
    _cache(store).save()
    return snap


def describe(snap: CodeSnapshot, planned: bool = False) -> str:
    """One line for the dry run (``planned``: nothing is written yet) and the submission."""
    git = snap.git
    where = (
        f"git {str(git.get('commit') or 'no commit')[:12]} on {git.get('branch')}"
        f"{', dirty (diff recorded)' if git.get('dirty') else ', clean'}"
        if git
        else "not a git checkout"
    )
    size = f"{snap.files} files, {snap.bytes / MB:.1f} MB"
    if snap.mode == "live":
        return f"code: live: the job runs {snap.source} as it is when it starts ({where}; not reproducible)"
    if snap.meshrun_dir != snap.source:
        verb = "would be stored" if planned else "stored"
        return f"code: snapshot {snap.digest[:16]} {verb} in {snap.meshrun_dir} ({size}; {where})"
    return f"code: {snap.mode} {snap.digest[:16]} of {snap.source} ({size}; {where})"


class StoreUndo:
    """Takes back what a submission that Slurm refused added to the store:
    the entries it made, and the store (and runs root) when it made them."""

    def __init__(self, cfg: RunConfig) -> None:
        self.store = store_root(cfg)
        self.new = [d for d in (self.store.parent, self.store) if not d.exists()]

    def undo(self, snap: CodeSnapshot | None) -> None:
        for entry in snap.created if snap is not None else []:
            shutil.rmtree(entry, ignore_errors=True)
        if self.store in self.new:
            for name in (HASH_CACHE, ".datacache.json"):
                (self.store / name).unlink(missing_ok=True)
            _CACHES.pop(str(self.store), None)
        for d in reversed(self.new):
            with contextlib.suppress(OSError):  # not empty: other runs use it
                d.rmdir()
