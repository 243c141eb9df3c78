"""The bad-node ledger: one append-only JSONL file shared by every run under a
runs root (``<launcher.runs_root>/bad_nodes.jsonl``), safe for concurrent
writers (each append holds an exclusive ``fcntl`` lock on the file).

A line is a fault the batch-level supervisor (launcher/ops/supervise.py)
put on a node: ``{"node", "time", "cause", "run", "job", "detail"}``; or a
retraction ``{"node", "time", "run", "retract": true, "cause"}`` written when
the same error later proved to be the code's, not the node's: it cancels
that run's earlier lines for the node.

New submissions exclude the nodes with at least ``launcher.bad_node_faults``
faults within the last ``launcher.bad_node_window_h`` hours
(:func:`bad_nodes`); ``meshrun nodes`` lists them. Standard library only.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any

from launcher.config.schema import RunConfig

LEDGER_FILE = "bad_nodes.jsonl"


def ledger_path(cfg: RunConfig) -> Path:
    return Path(cfg.launcher.runs_root).resolve() / LEDGER_FILE


def append(path: Path, rec: dict[str, Any]) -> None:
    """Append one line under an exclusive lock (concurrent runs, one file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"time": time.time(), **rec}, sort_keys=True) + "\n"
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def append_or_say(path: Path, rec: dict[str, Any], say: Any) -> None:
    """:func:`append`; a failed write is said through ``say(msg)`` (a fault
    must not stop the run's own handling of it)."""
    try:
        append(path, rec)
    except OSError as e:
        say(f"could not write the bad-node ledger {path}: {e}")


def read(path: Path) -> list[dict[str, Any]]:
    """Every readable line (a torn or foreign line is skipped)."""
    if not path.exists():
        return []
    with open(path) as f:
        fcntl.flock(f, fcntl.LOCK_SH)
        try:
            text = f.read()
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
    out = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("node"), str):
            out.append(rec)
    return out


def faults(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The fault lines that no later retraction of the same run and node cancels."""
    retracted = {(r["node"], r.get("run")) for r in records if r.get("retract")}
    return [r for r in records if not r.get("retract") and (r["node"], r.get("run")) not in retracted]


def bad_nodes(
    records: list[dict[str, Any]], min_faults: int, window_h: float, now: float | None = None
) -> dict[str, list[dict[str, Any]]]:
    """node -> its faults within the window, for nodes with >= min_faults of them."""
    now = time.time() if now is None else now
    since = now - window_h * 3600
    by_node: dict[str, list[dict[str, Any]]] = {}
    for r in faults(records):
        if float(r.get("time", 0)) >= since:
            by_node.setdefault(r["node"], []).append(r)
    return {n: rs for n, rs in sorted(by_node.items()) if len(rs) >= min_faults}


def describe(node: str, recs: list[dict[str, Any]]) -> str:
    causes = sorted({str(r.get("cause", "?")) for r in recs})
    return f"{node}: {len(recs)} fault(s) ({', '.join(causes)})"
