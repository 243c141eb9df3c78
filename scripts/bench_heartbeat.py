"""Shared-file-system load of heartbeats, side by side: main's old design (one
``heartbeats/rank<R>.json`` per rank in the run dir, rewritten and renamed
every step; the supervisor reads every file at each poll) against the current
one (launcher/config/health.py: ranks write node-local files, ONE writer per
node rewrites ``heartbeats/node-<node>.json`` every NODE_WRITE_S; the
supervisor reads one file per node).

    PYTHONPATH=. python scripts/bench_heartbeat.py [--ranks 1024 4096 16384] [--ranks-per-node 8]
    PYTHONPATH=. python scripts/bench_heartbeat.py --quick   # seconds (CI)

One "step" here is what happens in one second at a 1 s step: every rank
beats once, every node's writer writes once, the supervisor polls once
(POLL_S = 1 s). At a faster step the old design's writes grow with the step
rate, the new one's do not (the node file is rewritten per second).

How the operations are counted: a ``sys.addaudithook`` hook counts the
audited calls the code makes (``open`` events, split into writes and reads by
mode; ``os.rename`` (os.replace raises it); ``os.scandir``/``os.listdir``;
``os.mkdir``; ``os.remove``), and ``os.stat`` (not audited) is wrapped; each
is classed by path: under the run dir (the shared file system) or under the
node-local base. Poll time: the wall time of the supervisor's read (median of
``--polls``), on this host's disk and page cache (on Lustre each metadata
operation is a server round trip: the counts are what scales).
Last line: ``bench_heartbeat: ops_old_over_new=R poll_old_over_new=P`` at
the largest N.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from launcher.config import health

QUICK_RANKS = (64, 256)
_count: dict[str, Counter[str]] = {"shared": Counter(), "local": Counter()}
_roots: dict[str, str] = {}
_on = False


def _where(path: object) -> str | None:
    p = os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else ""
    for name, root in _roots.items():
        if p.startswith(root):
            return name
    return None


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if not _on or not args:
        return
    kind = {"os.rename": "rename", "os.scandir": "readdir", "os.listdir": "readdir", "os.mkdir": "mkdir"}.get(
        event, "remove" if event == "os.remove" else None
    )
    if event == "open":
        mode = args[1] if len(args) > 1 and isinstance(args[1], str) else "r"
        kind = "open_w" if any(c in mode for c in "wax+") else "open_r"
    if kind is not None and (w := _where(args[0])):
        _count[w][kind] += 1


_real_stat = os.stat


def _stat(path: Any, *a: Any, **k: Any) -> os.stat_result:
    if _on and (w := _where(path)):
        _count[w]["stat"] += 1
    return _real_stat(path, *a, **k)


# --- main's old design, as it was (launcher/config/health.py before node files) ---
def old_write(run_dir: Path, rank: int, node: str, step: int) -> None:
    rec = {"rank": rank, "node": node, "pid": os.getpid(), "job": "1", "step_id": "0", "attempt": "0.0"}
    rec.update(phase="step", step=step, time=time.time())
    path = run_dir / "heartbeats" / f"rank{rank}.json"
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(rec))
    os.replace(tmp, path)


def old_read(run_dir: Path) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    d = run_dir / "heartbeats"
    if not d.is_dir():
        return out
    for p in d.glob("rank*.json"):
        try:
            rec = json.loads(p.read_text())
            out[int(rec["rank"])] = rec
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def _step(ranks: int, rpn: int, design: str, run_dir: Path, step: int) -> None:
    """Every rank beats once; in the new design every node's writer then writes once."""
    for r in range(ranks):
        node = f"node{r // rpn}"
        if design == "old":
            old_write(run_dir, r, node, step)
        else:
            os.environ["SLURMD_NODENAME"] = node
            health.write_heartbeat(run_dir, r, "step", step)
    if design == "new":
        for n in range(ranks // rpn):
            os.environ["SLURMD_NODENAME"] = f"node{n}"
            health.NodeWriter(run_dir).flush()


def measure(ranks: int, rpn: int, design: str, polls: int, tmp: Path) -> dict[str, float]:
    global _on
    run_dir, local = tmp / f"{design}{ranks}" / "run", tmp / f"{design}{ranks}" / "local"
    (run_dir / "heartbeats").mkdir(parents=True)
    os.environ[health.NODE_HEARTBEAT_ENV] = str(local)
    _roots.update(shared=str(run_dir), local=str(local))
    read = old_read if design == "old" else health.read_heartbeats
    _step(ranks, rpn, design, run_dir, 1)  # first beats: directories and files exist
    for c in _count.values():
        c.clear()
    _on = True
    _step(ranks, rpn, design, run_dir, 2)
    got = read(run_dir)
    _on = False
    assert len(got) == ranks and all(h["step"] == 2 for h in got.values()), (design, ranks, len(got))
    times = []
    for _ in range(polls):
        t0 = time.perf_counter()
        read(run_dir)
        times.append(time.perf_counter() - t0)
    return {
        "shared": sum(_count["shared"].values()),
        "local": sum(_count["local"].values()),
        "poll_ms": 1000 * statistics.median(times),
        "detail": dict(_count["shared"]),  # type: ignore[dict-item]
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--ranks-per-node", type=int, default=8)
    ap.add_argument("--polls", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help=f"N = {QUICK_RANKS}, 3 polls")
    args = ap.parse_args(argv)
    ranks, polls = (QUICK_RANKS, 3) if args.quick else (args.ranks, args.polls)
    rpn = args.ranks_per_node
    sys.addaudithook(_hook)
    os.stat = _stat  # type: ignore[assignment]
    print(
        f"per step (1 s step: each rank beats once, each node file written once, one poll); {rpn} ranks/node"
    )
    ratios = (0.0, 0.0)
    with tempfile.TemporaryDirectory() as d:
        for n in ranks:
            old, new = (measure(n, rpn, design, polls, Path(d)) for design in ("old", "new"))
            ratios = (old["shared"] / new["shared"], old["poll_ms"] / new["poll_ms"])
            print(
                f"N={n} nodes={n // rpn}: shared-FS ops/step old={old['shared']:.0f} new={new['shared']:.0f} "
                f"(x{ratios[0]:.1f}; old {old['detail']}, new {new['detail']}; new node-local ops={new['local']:.0f}) "
                f"poll_ms old={old['poll_ms']:.1f} new={new['poll_ms']:.1f} (x{ratios[1]:.1f})",
                flush=True,
            )
    print(f"bench_heartbeat: ops_old_over_new={ratios[0]:.1f} poll_old_over_new={ratios[1]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
