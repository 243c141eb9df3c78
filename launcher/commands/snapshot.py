"""``python -m launcher.snapshot`` (``meshrun snapshot``): what a submission
would pack as its code snapshot (launcher/run/codesnap.py): digest, files,
size against ``launcher.code_max_mb``, git state; ``--list`` every file."""

from __future__ import annotations

import argparse

from launcher.config.prog import describe, prog
from launcher.config.schema import LauncherConfig
from launcher.run.codesnap import MB, HashCache, code_root, hash_tree, list_tree


def main(argv: list[str] | None = None) -> int:
    d = LauncherConfig()
    ap = argparse.ArgumentParser(prog=prog("python -m launcher.snapshot"), description=describe(__doc__))
    ap.add_argument("--list", action="store_true", help="every file that would be packed, with its size")
    ap.add_argument("--source", default=code_root(), help="the code dir (default: the one this runs from)")
    ap.add_argument("--max-mb", type=float, default=d.code_max_mb, help="the limit (launcher.code_max_mb)")
    args = ap.parse_args(argv)
    tree = list_tree(args.source)
    hash_tree(tree, HashCache(None))
    if args.list:
        for rel, size in tree.files:
            print(f"{size:>12,}  {rel}")
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
    )
    return 1 if over else 0
