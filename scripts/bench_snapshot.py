"""Code snapshot time and size (launcher/run/codesnap.py), for this repository
and for a generated tree of 10,000 files: list + hash (first time, then a
repeated submission served by the hash cache) and the store copy (first
time, then the content-addressed hit).

    python scripts/bench_snapshot.py           # 10,000 files of 4 KiB
    python scripts/bench_snapshot.py --quick   # 2,000 files: seconds (CI)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from launcher.run import codesnap  # noqa: E402


def make_tree(root: Path, files: int, size: int) -> None:
    """``files`` files of ``size`` bytes in launcher/ (100 per directory), committed to git."""
    for i in range(files):
        d = root / "launcher" / f"pkg{i // 100:03d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"mod{i % 100:03d}.py").write_bytes(os.urandom(size // 2).hex().encode()[:size])
    git = ["git", "-C", str(root), "-c", "user.name=b", "-c", "user.email=b@b"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "bench"], check=True)


def measure(name: str, source: str, store: Path) -> None:
    codesnap._TREES.clear()
    codesnap._CACHES.clear()
    t0 = time.perf_counter()
    tree = codesnap.list_tree(source)
    t_list = time.perf_counter() - t0
    cache = codesnap.HashCache(store / codesnap.HASH_CACHE)
    t0 = time.perf_counter()
    codesnap.hash_tree(tree, cache)
    t_hash = time.perf_counter() - t0
    t0 = time.perf_counter()
    store.mkdir(parents=True, exist_ok=True)
    path, copied = codesnap.store_tree(tree, store, "meshrun")
    t_copy = time.perf_counter() - t0
    cache.save()
    assert copied
    # A repeated submission: listing again, hashes from the cache, the store entry exists.
    codesnap._TREES.clear()
    t0 = time.perf_counter()
    again = codesnap.list_tree(source)
    codesnap.hash_tree(again, codesnap.HashCache(store / codesnap.HASH_CACHE))
    _, copied_again = codesnap.store_tree(again, store, "meshrun")
    t_repeat = time.perf_counter() - t0
    assert again.digest == tree.digest and not copied_again
    print(
        f"SNAPSHOT {name}: {len(tree.files)} files, {tree.bytes / codesnap.MB:.2f} MB; "
        f"list {t_list:.3f} s, hash {t_hash:.3f} s, copy {t_copy:.3f} s (first: {t_list + t_hash + t_copy:.3f} s); "
        f"repeated submission {t_repeat:.3f} s"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2,000 generated files instead of 10,000")
    ap.add_argument("--files", type=int, default=0)
    ap.add_argument("--size", type=int, default=4096, help="bytes per generated file")
    args = ap.parse_args()
    files = args.files or (2000 if args.quick else 10_000)
    with tempfile.TemporaryDirectory(prefix="bench-snapshot-") as tmp:
        measure("this repository", str(ROOT), Path(tmp) / "store-repo")
        tree = Path(tmp) / "tree"
        make_tree(tree, files, args.size)
        measure(f"generated tree of {files} files", str(tree), Path(tmp) / "store-tree")
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
