"""Stragglers: the rule the batch-level supervisor (launcher/selfheal/supervisor.py)
applies to the ranks' solo probes (train/observe/probe.py: a fixed matmul
loop each rank times alone every ``launcher.straggler_probe_every_steps``
steps, carried in its heartbeat as ``probes: [[step, seconds, after_save]]``).

The rule (docs/self-healing.md):

- at a probe step every rank of the attempt reported, a rank's ratio is its
  time over the median of its peers' (the other ranks') times; a probe
  tagged ``after_save`` (a save at the step before: its staging and the
  checkpoint worker compete) on any rank drops that step for all;
- a rank is **slow** on a probe when its ratio exceeds
  ``launcher.straggler_threshold``; it is a **straggler** when slow on at
  least ``launcher.straggler_min_slow`` of its last
  ``launcher.straggler_window`` counted probes (a full window needed);
- a **node** is a straggler when any of its ranks is (one slow GPU holds
  back every collective); its score is its worst straggling rank's median
  ratio over the window.

Standard library only.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from launcher.config.runfiles import STRAGGLERS_FILE
from launcher.config.schema import LauncherConfig


def probe_steps(hbs: dict[int, dict[str, Any]]) -> dict[int, dict[int, tuple[float, bool]]]:
    """rank -> {probe step: (seconds, after_save)} from the ranks' heartbeats."""
    out: dict[int, dict[int, tuple[float, bool]]] = {}
    for rank, h in hbs.items():
        for p in h.get("probes") or []:
            try:
                step, seconds, after = int(p[0]), float(p[1]), bool(p[2])
            except (TypeError, ValueError, IndexError):
                continue  # a foreign or torn entry
            if seconds > 0:
                out.setdefault(rank, {})[step] = (seconds, after)
    return out


def ratios(probes: dict[int, dict[int, tuple[float, bool]]], world: int) -> dict[int, dict[int, float]]:
    """probe step -> rank -> its time over the median of its peers', for the
    steps all ``world`` ranks reported and none tagged after_save."""
    if world < 2 or len(probes) < world:
        return {}
    steps = set.intersection(*(set(p) for p in probes.values()))
    out: dict[int, dict[int, float]] = {}
    for s in sorted(steps):
        if any(probes[r][s][1] for r in probes):
            continue
        times = {r: probes[r][s][0] for r in probes}
        out[s] = {r: t / statistics.median([v for q, v in times.items() if q != r]) for r, t in times.items()}
    return out


def rank_verdicts(
    by_step: dict[int, dict[int, float]], threshold: float, window: int, min_slow: int
) -> dict[int, dict[str, Any]]:
    """rank -> {slow, window, probe_steps, score, straggler} over its last
    ``window`` counted probes."""
    out: dict[int, dict[str, Any]] = {}
    ranks = {r for v in by_step.values() for r in v}
    for r in sorted(ranks):
        last = [(s, v[r]) for s, v in sorted(by_step.items()) if r in v][-window:]
        slow = sum(1 for _, x in last if x > threshold)
        out[r] = {
            "slow": slow,
            "window": len(last),
            "probe_steps": [s for s, _ in last],
            "score": round(statistics.median(x for _, x in last), 3) if last else 0.0,
            "straggler": len(last) == window and slow >= min_slow,
        }
    return out


class StragglerWatch:
    """The probes one attempt's ranks reported and the nodes flagged."""

    def __init__(self, lc: LauncherConfig, world: int) -> None:
        self.threshold, self.window, self.min_slow = (
            lc.straggler_threshold,
            lc.straggler_window,
            lc.straggler_min_slow,
        )
        self.world = world
        self.seen: dict[int, dict[int, tuple[float, bool]]] = {}
        self.flagged: dict[str, dict[str, Any]] = {}
        self.nodes: dict[int, str] = {}

    def rule(self) -> str:
        return (
            f"probe time > {self.threshold:g} x the median of its peers' on >= {self.min_slow} of the last "
            f"{self.window} probes (launcher.straggler_threshold/_min_slow/_window)"
        )

    def observe(
        self, hbs: dict[int, dict[str, Any]]
    ) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
        """Take in the attempt's heartbeats: (node -> {score, ranks, ...} for
        every node with a verdict, the nodes flagged now for the first time)."""
        for rank, steps in probe_steps(hbs).items():
            self.seen.setdefault(rank, {}).update(steps)
            if hbs[rank].get("node"):
                self.nodes[rank] = str(hbs[rank]["node"])
        verdicts = rank_verdicts(ratios(self.seen, self.world), self.threshold, self.window, self.min_slow)
        by_node: dict[str, dict[str, Any]] = {}
        for r, v in verdicts.items():
            node = self.nodes.get(r)
            if node is None:
                continue
            n = by_node.setdefault(node, {"node": node, "score": 0.0, "ranks": [], "verdicts": {}})
            n["verdicts"][r] = v
            if v["straggler"]:
                n["ranks"].append(r)
        new = []
        for node, n in by_node.items():
            # The worst straggling rank's score; none straggling: the worst rank's.
            n["score"] = max(n["verdicts"][r]["score"] for r in n["ranks"] or n["verdicts"])
            if n["ranks"] and node not in self.flagged:
                self.flagged[node] = n
                new.append(n)
        return by_node, new


def write_scores(run_dir: str, attempt: str, nodes: dict[str, dict[str, Any]], flagged: set[str]) -> None:
    """``<run_dir>/stragglers.json`` (rank 0 serves it to Prometheus): each
    node's score and whether it is a straggler; written and renamed."""
    rec = {
        "time": time.time(),
        "attempt": attempt,
        "nodes": {n: {"score": v["score"], "straggler": n in flagged} for n, v in sorted(nodes.items())},
    }
    path = Path(run_dir) / STRAGGLERS_FILE
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(rec, sort_keys=True))
    os.replace(tmp, path)
