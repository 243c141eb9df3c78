"""Code snapshot time and size (launcher/run/codesnap.py), for this repository
and for a generated tree of 10,000 files: list + hash (first time, then a
repeated submission served by the hash cache) and the store copy (first
time, then the content-addressed hit, verified before it is used:
launcher/run/codestore.py). ``verify`` is that verification alone, against
a cached snapshot's list + hash (the budget: at most +50%).

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

from launcher.run import codesnap, codestore  # noqa: E402


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


class Changed(Exception):
    """The checkout was edited while it was measured (others work in it): measured again."""


def measure_stable(name: str, source: str, store: Path) -> float:
    for attempt in range(5):
        try:
            return measure(
                name, source, store.parent.with_name(f"{store.parent.name}-{attempt}") / store.name
            )
        except Changed:
            continue
    raise SystemExit(f"bench_snapshot: {source} kept changing while it was measured")


def measure(name: str, source: str, store: Path) -> float:
    """Prints the figures; returns verification's share of a cached snapshot's time."""
    codesnap._TREES.clear()
    codesnap._CACHES.clear()
    cache_path = codestore.user_store(store) / codesnap.HASH_CACHE
    t0 = time.perf_counter()
    tree = codesnap.list_tree(source)
    t_list = time.perf_counter() - t0
    cache = codesnap.HashCache(cache_path)
    t0 = time.perf_counter()
    codesnap.hash_tree(tree, cache)
    t_hash = time.perf_counter() - t0
    t0 = time.perf_counter()
    path, copied = codesnap.store_tree(tree, store, "meshrun", cache)
    t_copy = time.perf_counter() - t0
    cache.save()
    assert copied
    # A repeated submission, before verification: listing again, hashes from the cache.
    codesnap._TREES.clear()
    t0 = time.perf_counter()
    again = codesnap.list_tree(source)
    warm = codesnap.HashCache(cache_path)
    codesnap.hash_tree(again, warm)
    t_cached = time.perf_counter() - t0
    # Verification of the existing entry (what the reuse adds), then the whole repeated submission.
    entry = Path(path).parent
    t0 = time.perf_counter()
    if again.digest != tree.digest:
        raise Changed(name)
    why = codestore.verify_entry(entry, again.digest, "meshrun", warm)
    t_verify = time.perf_counter() - t0
    assert why is None, why
    codesnap._TREES.clear()
    t0 = time.perf_counter()
    again = codesnap.list_tree(source)
    codesnap.hash_tree(again, warm)
    _, copied_again = codesnap.store_tree(again, store, "meshrun", warm)
    t_repeat = time.perf_counter() - t0
    if again.digest != tree.digest:
        raise Changed(name)
    assert not copied_again
    share = t_verify / t_cached
    print(
        f"SNAPSHOT {name}: {len(tree.files)} files, {tree.bytes / codesnap.MB:.2f} MB; "
        f"list {t_list:.3f} s, hash {t_hash:.3f} s, copy {t_copy:.3f} s (first: {t_list + t_hash + t_copy:.3f} s); "
        f"cached {t_cached:.3f} s, verify {t_verify:.3f} s (+{100 * share:.0f}%); "
        f"repeated submission {t_repeat:.3f} s"
    )
    return share


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2,000 generated files instead of 10,000")
    ap.add_argument("--files", type=int, default=0)
    ap.add_argument("--size", type=int, default=4096, help="bytes per generated file")
    args = ap.parse_args()
    files = args.files or (2000 if args.quick else 10_000)
    with tempfile.TemporaryDirectory(prefix="bench-snapshot-") as tmp:
        shares = [measure_stable("this repository", str(ROOT), Path(tmp) / "runs-repo" / codesnap.STORE_DIR)]
        tree = Path(tmp) / "tree"
        make_tree(tree, files, args.size)
        store = Path(tmp) / "runs-tree" / codesnap.STORE_DIR
        shares.append(measure_stable(f"generated tree of {files} files", str(tree), store))
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"bench_snapshot: verify_over_cached={max(shares):.2f} (budget 0.50)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
