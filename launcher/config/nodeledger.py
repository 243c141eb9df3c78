"""The bad-node ledger: one append-only JSONL file shared by every run under a
runs root (``<launcher.runs_root>/bad_nodes.jsonl``), safe for concurrent
writers (each append holds an exclusive ``fcntl`` lock on the file).

A line is a fault the batch-level supervisor (launcher/selfheal/supervisor.py)
put on a node: ``{"node", "time", "cause", "run", "job", "detail"}``; or a
retraction ``{"node", "time", "run", "retract": true, "cause"}`` written when
the same error later proved to be the code's, not the node's: it cancels
that run's earlier lines for the node; or a burn-in's result
``{"node", "time", "burnin": "pass"|"fail", "run", "job", "detail"}``
(launcher/selfheal/growback.py: the preflight's node checks and a single-node
all-reduce on a node a fault left out), with ``"cleared": true`` on the
pass that completed ``launcher.burnin_passes`` passes in a row: the node's
faults before that line no longer count (:func:`faults`), and until it,
a node with passes since its newest fault is on probation
(:func:`standing`).

New submissions exclude the nodes with at least ``launcher.bad_node_faults``
faults within the last ``launcher.bad_node_window_h`` hours
(:func:`bad_nodes`); ``meshrun nodes`` lists them. Standard library only.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from launcher.config import nodename
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


def _say(msg: str) -> None:
    print(f"meshrun: warning: {msg}", file=sys.stderr, flush=True)


def line_problem(rec: Any) -> str | None:
    """Why a parsed ledger line cannot be used (None: it can): its node must
    be one node's name (launcher/config/nodename.py), its time a number."""
    if not isinstance(rec, dict):
        return "not a JSON object"
    if (why := nodename.problem(rec.get("node"))) is not None:
        return why
    t = rec.get("time")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
        return f"time {t!r} is not a number of seconds"
    return None


def skipped_warning(path: Path, bad: list[tuple[int, str]], shown: int = 3) -> str:
    """One warning for the lines of ``path`` that were skipped: (line number, why)."""
    more = f"; and {len(bad) - shown} more" if len(bad) > shown else ""
    lines = "; ".join(f"line {n}: {why}" for n, why in bad[:shown])
    return f"{path}: skipped {len(bad)} unusable line(s): {lines}{more}"


def read(path: Path, say: Callable[[str], None] = _say) -> list[dict[str, Any]]:
    """Every usable line. A line that is not JSON, names no single node
    (a range, a list, a control character: :func:`line_problem`) or has no
    numeric time is skipped; all such lines are said in ONE warning naming
    the file and the lines (``say``; default: stderr)."""
    if not path.exists():
        return []
    with open(path) as f:
        fcntl.flock(f, fcntl.LOCK_SH)
        try:
            text = f.read()
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
    out, bad = [], []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            bad.append((n, "not JSON (a torn or foreign line)"))
            continue
        if (why := line_problem(rec)) is not None:
            bad.append((n, why))
            continue
        out.append(rec)
    if bad:
        say(skipped_warning(path, bad))
    return out


def is_burnin(rec: dict[str, Any]) -> bool:
    return "burnin" in rec


def cleared_at(records: list[dict[str, Any]]) -> dict[str, float]:
    """node -> the time of its newest clearing burn-in line."""
    out: dict[str, float] = {}
    for r in records:
        if is_burnin(r) and r.get("cleared") is True and r.get("burnin") == "pass":
            out[r["node"]] = max(out.get(r["node"], 0.0), float(r["time"]))
    return out


def faults(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The fault lines that no later retraction of the same run and node
    cancels and no later clearing burn-in of the node wiped."""
    retracted = {(r["node"], r.get("run")) for r in records if r.get("retract")}
    cleared = cleared_at(records)
    return [
        r
        for r in records
        if not r.get("retract")
        and not is_burnin(r)
        and (r["node"], r.get("run")) not in retracted
        and float(r["time"]) > cleared.get(r["node"], float("-inf"))
    ]


def standing(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """node -> its burn-in standing, for nodes with a burn-in line:
    ``{"state": "probation"|"cleared"|"failed", "passes": passes in a row
    since its newest fault, "at": the newest burn-in's time}``. Probation:
    a fault not cleared by a burn-in after it (passes may be 0: a fault
    came after the clearing); failed: its newest burn-in failed."""
    recs = [r for r in records if line_problem(r) is None]
    counted = faults(recs)
    out: dict[str, dict[str, Any]] = {}
    for node in sorted({r["node"] for r in recs if is_burnin(r)}):
        last_fault = max((float(r["time"]) for r in counted if r["node"] == node), default=float("-inf"))
        burnins = [r for r in recs if is_burnin(r) and r["node"] == node]
        since = [r for r in burnins if float(r["time"]) > last_fault]
        passes = 0
        for r in since:
            passes = passes + 1 if r.get("burnin") == "pass" else 0
        newest = burnins[-1]
        if newest.get("burnin") != "pass":
            state = "failed"
        elif (newest.get("cleared") is True and float(newest["time"]) > last_fault) or last_fault == float(
            "-inf"
        ):
            state = "cleared"
        else:
            state = "probation"
        out[node] = {"state": state, "passes": passes, "at": float(newest["time"])}
    return out


def bad_nodes(
    records: list[dict[str, Any]], min_faults: int, window_h: float, now: float | None = None
) -> dict[str, list[dict[str, Any]]]:
    """node -> its faults within the window, for nodes with >= min_faults of them."""
    now = time.time() if now is None else now
    since = now - window_h * 3600
    by_node: dict[str, list[dict[str, Any]]] = {}
    for r in faults([r for r in records if line_problem(r) is None]):
        if r["time"] >= since:
            by_node.setdefault(r["node"], []).append(r)
    return {n: rs for n, rs in sorted(by_node.items()) if len(rs) >= min_faults}


def plain(text: object, limit: int = 200) -> str:
    """``text`` for a terminal, a log or an argument: control characters shown as "?"."""
    return "".join(c if c.isprintable() else "?" for c in str(text)[:limit])


def causes(recs: list[dict[str, Any]]) -> list[str]:
    return sorted({plain(r.get("cause", "?"), 60) for r in recs})


def describe(node: str, recs: list[dict[str, Any]]) -> str:
    causes_ = causes(recs)
    return f"{node}: {len(recs)} fault(s) ({', '.join(causes_)})"
