"""``python -m launcher.snapshot`` (``meshrun snapshot``): what a submission
would pack as its code snapshot (launcher/run/codesnap.py): digest, files,
size against ``launcher.code_max_mb``, git state, what is left out and why;
``--list`` every file (exactly what a submission packs), ``--gc`` remove
your store entries no live run uses."""

from __future__ import annotations

import argparse
from pathlib import Path

from launcher.config.prog import describe, prog
from launcher.config.schema import LauncherConfig
from launcher.run.codegc import gc
from launcher.run.codeship import local_store_root
from launcher.run.codesnap import (
    MB,
    PACKAGES,
    STORE_DIR,
    TOP_FILES,
    HashCache,
    code_root,
    hash_tree,
    list_tree,
)


def main(argv: list[str] | None = None) -> int:
    d = LauncherConfig()
    ap = argparse.ArgumentParser(prog=prog("python -m launcher.snapshot"), description=describe(__doc__))
    ap.add_argument("--list", action="store_true", help="every file that would be packed, with its size")
    ap.add_argument("--source", default=code_root(), help="the code dir (default: the one this runs from)")
    ap.add_argument("--workdir", default="", help="a script job's project dir (job.workdir) instead")
    ap.add_argument("--runs-root", default=d.runs_root, help="launcher.runs_root (never packed)")
    ap.add_argument(
        "--include", action="append", default=[], help="launcher.code_include: a path packed on purpose"
    )
    ap.add_argument("--max-mb", type=float, default=d.code_max_mb, help="the limit (launcher.code_max_mb)")
    ap.add_argument("--gc", action="store_true", help="remove your store entries no live run uses")
    ap.add_argument("--keep-days", type=float, default=7.0, help="with --gc: runs this recent count as live")
    ap.add_argument(
        "--shipped",
        action="store_true",
        help="with --gc: this machine's store of code shipped over SSH (cluster.login) instead of the runs root's",
    )
    args = ap.parse_args(argv)
    if args.shipped and not args.gc:
        ap.error("--shipped goes with --gc (the store of code shipped over SSH is only ever cleaned)")
    runs_root = (local_store_root() if args.shipped else Path(args.runs_root)).resolve()
    if args.gc:
        removed, kept = gc(runs_root, args.keep_days)
        for line in kept:
            print(f"kept     {line}")
        for line in removed:
            print(f"removed  {line}")
        print(
            f"meshrun snapshot --gc: {len(removed)} entries removed, {len(kept)} kept in {runs_root / STORE_DIR}"
        )
        return 0
    root = args.workdir or args.source
    tops, files = ((".",), ()) if args.workdir else (PACKAGES, TOP_FILES)
    tree = list_tree(root, tops, files, exclude=(str(runs_root),), include=tuple(args.include))
    hash_tree(tree, HashCache(None))
    if args.list:
        for rel, size in tree.files:
            print(f"{size:>12,}  {rel}")
        for rel, why in tree.left_out:
            print(f"{'left out':>12}  {rel} ({why})")
    git = tree.git
    state = (
        f"git {git.get('commit') or 'no commit'} on {git.get('branch')}, {'dirty' if git.get('dirty') else 'clean'}"
        if git
        else "not a git checkout"
    )
    over = tree.bytes > args.max_mb * MB
    print(
        f"meshrun snapshot: {len(tree.files)} files, {tree.bytes / MB:.2f} MB of {tree.root} "
        f"(limit {args.max_mb:g} MB{': OVER' if over else ''}); digest {tree.digest}; {state}"
        f"{f'; {len(tree.left_out)} left out (--list names them)' if tree.left_out else ''}"
    )
    return 1 if over else 0
