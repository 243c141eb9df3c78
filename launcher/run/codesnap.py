"""The code a run runs: packed at submission into a content-addressed store.

``launcher.code=snapshot`` (the default) copies the meshrun code this
launcher was imported from (launcher/, train/, hydra_plugins/, conf/,
pyproject.toml: what a job imports and composes) into
``<runs_root>/.code/<user>/<digest>/meshrun/``, once per distinct content: every
point of a sweep and every run with the same code share one copy. The Slurm
job puts that copy on ``PYTHONPATH`` (or mounts it in the container), so a
job waiting in the queue, each requeue and each restart run the code as it
was submitted, whatever the checkout holds later.

Which files are packed (git's, or every file outside git; links followed,
submodules included, special files, the runs root and credentials left
out) is launcher/run/codewalk.py; the store, its modes, the verification of
an entry before it is used and who may remove one, launcher/run/codestore.py.
The digest covers each file's path, mode (less write bits) and content
only, so a snapshot of a snapshot has the same digest (``meshrun rerun``).
The recorded diff of uncommitted changes is scanned for credentials
(masked, said) and leaves out the files left out as credentials.

``launcher.code=clean`` refuses a tree with uncommitted changes; ``live``
runs the checkout (today's behaviour, said in the dry run and the run
record). A job kind that runs a team's program (``job.kind=script``) gets its
project dir (``job.workdir``) packed the same way as a second tree
(``CodeSnapshot.project_dir``).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import secrets
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.config.schema import RunConfig
from launcher.config.spec import RunSpec
from launcher.config.validate import ConfigError, fail
from launcher.run import codestore
from launcher.run.codestore import DATA_CACHE, HASH_CACHE, LOCK_FILE, HashCache, hash_tree
from launcher.run.codewalk import SNAPSHOT_FILE, STORE_DIR, Tree, git_state, in_git, stored_info, walk_tree

__all__ = ["HASH_CACHE", "SNAPSHOT_FILE", "STORE_DIR", "HashCache", "Tree", "hash_tree", "list_tree"]

# What a job imports and composes (render.py's CODE_DIR holds them).
PACKAGES = ("launcher", "train", "hydra_plugins", "conf")
TOP_FILES = ("pyproject.toml",)
MB = 1 << 20


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
    left_out: list[str] = field(default_factory=list)  # "path (why)": credentials, special files, links

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
            "left_out": self.left_out,
        }


def code_root() -> str:
    """The meshrun code this launcher runs from (render.py's CODE_DIR)."""
    return str(Path(__file__).resolve().parents[2])


# Listings by (root, tops, files, exclude, include) for this process: a sweep's points list once.
_TREES: dict[tuple[Any, ...], Tree] = {}


def list_tree(
    root: str,
    tops: tuple[str, ...] = PACKAGES,
    files: tuple[str, ...] = TOP_FILES,
    exclude: tuple[str, ...] = (),
    include: tuple[str, ...] = (),
) -> Tree:
    """The files ``root`` would pack, with their sizes, what is left out and
    git's state (listed once per submission: its points share one version
    of the code; the API's next call lists again, forget_listings). ``exclude``: folders never packed (the runs root);
    ``include``: credential-looking paths packed on purpose."""
    root = str(Path(root).resolve())
    key = (root, tops, files, exclude, include)
    if key not in _TREES:
        listed, left_out = walk_tree(root, tops, files, exclude, include)
        if in_git(root):
            git = git_state(root, (*tops, *files), {rel for rel, _ in left_out})
        else:
            git = dict((stored_info(root) or {}).get("git") or {})
        _TREES[key] = Tree(root=root, files=listed, git=git, left_out=left_out, include=include)
    t = _TREES[key]
    return Tree(root=t.root, files=list(t.files), git=dict(t.git), left_out=list(t.left_out), include=include)


def forget_listings() -> None:
    """List every tree again: a new submission in this process (the Python
    API's next call, after the user edited the project)."""
    _TREES.clear()


# One cache per user store for this process: a sweep's points hash once.
_CACHES: dict[str, HashCache] = {}


def _cache(store: Path) -> HashCache:
    """This user's ``<store>/<user>/.hashcache.json`` (read when it is theirs
    and private); saved only once a snapshot is stored."""
    key = str(store)
    if key not in _CACHES:
        _CACHES[key] = HashCache(codestore.user_store(store) / HASH_CACHE)
    return _CACHES[key]


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


def check_workdir(root: str) -> None:
    """Refuse ``/`` or a home directory as the project dir: packing it would
    copy whatever is there (SSH and cloud keys) into the store."""
    real = os.path.realpath(root)
    homes = {"/", os.path.realpath(os.path.expanduser("~"))}
    with contextlib.suppress(OSError, KeyError):
        homes.add(os.path.realpath(pwd.getpwuid(os.stat(real).st_uid).pw_dir))
    if real in homes:
        raise fail(
            "job.workdir",
            root,
            "is / or a home directory: packing it would copy every file there into the code snapshot; "
            "keep the program in a project folder (with pyproject.toml or .git) or set job.workdir=<that folder>",
        )


def _includes(cfg: RunConfig, roots: list[str]) -> list[tuple[str, ...]]:
    """``launcher.code_include`` relative to each tree root; one that is in no tree is refused."""
    out: list[list[str]] = [[] for _ in roots]
    for i, raw in enumerate(cfg.launcher.code_include):
        found = False
        for j, root in enumerate(roots):
            full = os.path.normpath(os.path.join(root, raw))
            if os.path.lexists(full) and (full + "/").startswith(root.rstrip("/") + "/"):
                out[j].append(os.path.relpath(full, root))
                found = True
        if not found:
            raise fail(
                f"launcher.code_include[{i}]",
                raw,
                f"no such file or folder in {' or '.join(roots)}; name a path relative to job.workdir "
                "(or the meshrun code dir) that exists, or drop it",
            )
    return [tuple(x) for x in out]


def plan_code(cfg: RunConfig) -> tuple[Tree, Tree | None]:
    """The trees a run would pack, hashed and checked; writes nothing.
    Refusals are :class:`ConfigError` naming the field."""
    store = store_root(cfg)
    cache = _cache(store)
    exclude = (str(store.parent),)
    root = _project_root(cfg)
    if root is not None:
        check_workdir(root)
    roots = [code_root(), *([str(Path(root).resolve())] if root is not None else [])]
    includes = _includes(cfg, roots)
    tree = list_tree(code_root(), exclude=exclude, include=includes[0])
    check_tree(cfg, tree)
    hash_tree(tree, cache)
    project = None
    if root is not None:
        project = list_tree(root, tops=(".",), files=(), exclude=exclude, include=includes[1])
        check_tree(cfg, project, what="the project dir (job.workdir)")
        hash_tree(project, cache)
    return tree, project


def store_tree(tree: Tree, store: Path, kind: str, cache: HashCache | None = None) -> tuple[str, bool]:
    """``<store>/<user>/<digest>/<kind>`` holding ``tree``; (its path, copied
    now). An existing entry is used only once verified (launcher/run/codestore.py);
    one that fails is rebuilt. A new one is written into a temporary
    directory and renamed into place."""
    cache = cache if cache is not None else _cache(store)
    udir = codestore.ensure_user_store(store)
    for _ in range(4):  # a race lost to a refused submission removing the entry: try again
        entry = udir / tree.digest
        if os.path.lexists(entry):
            why = (
                codestore.verify_entry(entry, tree.digest, kind, cache)
                if codestore.hold(entry)
                else "it has no lock file"
            )
            if why is None and entry.exists():
                codestore.mark_used(udir, tree.digest)
                return str(entry / kind), False
            codestore.release(entry)
            if os.path.lexists(entry) and why is not None:
                print(
                    f"meshrun: code store entry {entry} failed verification ({why}): rebuilt", file=sys.stderr
                )
                codestore.discard(entry)
            continue
        if _build(tree, udir, kind, cache):
            return str(udir / tree.digest / kind), True
    raise ConfigError(
        f"the code store entry {udir / tree.digest} kept changing while it was being used; submit again"
    )


def _build(tree: Tree, udir: Path, kind: str, cache: HashCache) -> bool:
    """Write the entry; False when another submission put one there first (use that)."""
    dmode = codestore.dir_mode(udir.parent)
    tmp = udir / f".tmp-{tree.digest[:16]}-{secrets.token_hex(4)}"
    try:
        (tmp / kind).mkdir(parents=True)  # an empty tree (a workdir with no files) is a snapshot too
        copied = codestore.copy_tree(tree, tmp / kind, cache, dmode)
        if copied.digest != tree.digest:  # edited while being copied: the copy's content is what runs
            tree.digest, tree.hashes, tree.modes = copied.digest, copied.hashes, copied.modes
            if os.path.lexists(udir / tree.digest):
                return False
        meta = {
            "digest": tree.digest,
            "kind": kind,
            "source": tree.root,
            "git": tree.git,
            "files": copied.hashes,
            "modes": copied.modes,
            "left_out": [f"{rel} ({why})" for rel, why in tree.left_out],
        }
        for name, text in (
            (SNAPSHOT_FILE, json.dumps(meta, indent=1, sort_keys=True) + "\n"),
            (LOCK_FILE, ""),
        ):
            fd = os.open(tmp / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with open(fd, "w") as f:
                f.write(text)
            os.chmod(tmp / name, dmode & 0o440)
        os.chmod(tmp, dmode)
        try:
            os.rename(tmp, udir / tree.digest)
        except OSError:
            if not os.path.lexists(udir / tree.digest):  # not a lost race: a real failure
                raise
            return False
        _rekey(cache, str(tmp), str(udir / tree.digest))
        return codestore.hold(udir / tree.digest)
    finally:
        if tmp.exists():
            codestore.discard(tmp)


def _rekey(cache: HashCache, old: str, new: str) -> None:
    """The copy's digests, cached under its temporary path, under the entry's: its first use is verified fast."""
    for path in [p for p in cache.entries if p.startswith(old + "/")]:
        cache.entries[new + path[len(old) :]] = cache.entries.pop(path)


def _tree_record(tree: Tree, dir_: str | None = None) -> dict[str, Any]:
    return {
        "source": tree.root,
        "dir": dir_,
        "digest": tree.digest,
        "files": len(tree.files),
        "bytes": tree.bytes,
        "git": tree.git,
    }


def _copies(cfg: RunConfig) -> bool:
    return cfg.launcher.code != "live" and cfg.cluster.kind == "slurm"


def _copies_project(cfg: RunConfig) -> bool:
    """A script job's project is stored for local runs too (unless live):
    its program then starts in the run's own workdir copy, as on Slurm, so a
    relative checkpoint path or resume glob means the same thing here and
    there, and the project never collects a run's outputs."""
    return cfg.launcher.code != "live"


def plan_snapshot(cfg: RunConfig) -> CodeSnapshot:
    """What :func:`snapshot_run` would give, written nowhere (the dry run,
    prepare's checks): ``meshrun_dir`` is where the store holds (or would
    hold) the copy. Raises :class:`ConfigError` for a refused tree."""
    tree, project = plan_code(cfg)
    udir = codestore.user_store(store_root(cfg))
    copy = _copies(cfg)
    project_dir = None
    if project is not None:
        project_dir = str(udir / project.digest / "project") if _copies_project(cfg) else project.root
    trees = [tree, *([project] if project is not None else [])]
    return CodeSnapshot(
        digest=tree.digest,
        meshrun_dir=str(udir / tree.digest / "meshrun") if copy else tree.root,
        project_dir=project_dir,
        mode=cfg.launcher.code,
        source=tree.root,
        files=len(tree.files),
        bytes=tree.bytes,
        git=tree.git,
        project=_tree_record(project, project_dir) if project is not None else None,
        left_out=[f"{os.path.join(t.root, rel)} ({why})" for t in trees for rel, why in t.left_out],
    )


def snapshot_run(spec: RunSpec) -> CodeSnapshot:
    """The code ``spec`` runs. ``launcher.code=snapshot|clean`` on Slurm: the
    store's copy (made now unless a verified one with this digest exists);
    local runs and ``live``: the checkout itself, its digest and git state
    recorded. A script job's project is stored unless ``live``, local runs
    included. Raises :class:`ConfigError` (nothing written) for a refused tree."""
    cfg = spec.cfg
    snap = plan_snapshot(cfg)
    tree, project = plan_code(cfg)
    stores_project = project is not None and _copies_project(cfg)
    if not _copies(cfg) and not stores_project:
        return snap
    store = store_root(cfg)
    if _copies(cfg):
        snap.meshrun_dir, snap.copied = store_tree(tree, store, "meshrun")
        snap.digest = tree.digest
        if snap.copied:
            snap.created.append(str(Path(snap.meshrun_dir).parent))
    if stores_project:
        snap.project_dir, made = store_tree(project, store, "project")
        snap.project = _tree_record(project, snap.project_dir)
        if made:
            snap.created.append(str(Path(snap.project_dir).parent))
    _cache(store).save()
    return snap


def describe(snap: CodeSnapshot, planned: bool = False) -> str:
    """One line for the dry run (``planned``: nothing is written yet) and the submission."""
    git = snap.git
    masked = git.get("diff_redacted") or []
    where = (
        f"git {str(git.get('commit') or 'no commit')[:12]} on {git.get('branch')}"
        f"{', dirty (diff recorded)' if git.get('dirty') else ', clean'}"
        f"{f'; diff: {len(masked)} credential(s) masked or left out ({masked[0]})' if masked else ''}"
        if git
        else "not a git checkout"
    )
    size = f"{snap.files} files, {snap.bytes / MB:.1f} MB"
    left = ""
    if snap.left_out:
        more = f", and {len(snap.left_out) - 5} more" if len(snap.left_out) > 5 else ""
        left = (
            f"; left out: {', '.join(snap.left_out[:5])}{more} (pack one on purpose with "
            "launcher.code_include=[PATH]; `meshrun snapshot --list` lists all)"
        )
    if snap.mode == "live":
        return f"code: live: the job runs {snap.source} as it is when it starts ({where}; not reproducible)"
    if snap.meshrun_dir != snap.source:
        verb = "would be stored" if planned else "stored"
        return f"code: snapshot {snap.digest[:16]} {verb} in {snap.meshrun_dir} ({size}; {where}){left}"
    return f"code: {snap.mode} {snap.digest[:16]} of {snap.source} ({size}; {where}){left}"


class StoreUndo:
    """Takes back what a submission that Slurm refused added to the store:
    an entry it made that nobody else uses (launcher/run/codestore.py's
    undo_entry: never one another submission holds or reused), and the
    store folders (and runs root) it made, once empty."""

    def __init__(self, cfg: RunConfig) -> None:
        self.store = store_root(cfg)
        self.udir = codestore.user_store(self.store)
        self.new = [d for d in (self.store.parent, self.store, self.udir) if not d.exists()]

    def undo(self, snap: CodeSnapshot | None) -> None:
        kept = [e for e in (snap.created if snap is not None else []) if not codestore.undo_entry(Path(e))]
        if self.udir in self.new and not kept:
            for name in (HASH_CACHE, DATA_CACHE):
                (self.udir / name).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                for mark in (self.udir / codestore.USED_DIR).iterdir():
                    mark.unlink()
                (self.udir / codestore.USED_DIR).rmdir()
            _CACHES.pop(str(self.store), None)
        for d in reversed(self.new):
            with contextlib.suppress(OSError):  # not empty: other runs use it
                d.rmdir()
