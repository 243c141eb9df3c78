"""Size a Slurm request to the QOS share when the user did not size it.

A cluster preset describes the cluster (``4node``: 4 nodes x 8 GPUs), but a
team may hold only its QOS share of it (``qos=research``: 40%, 12 of 32
GPUs; ``launcher.qos_admin`` renders the same shares as GrpTRES). A request
for the whole cluster is refused by every team's QOS, so a first submission
with the preset's size could never run. When neither ``cluster.nodes`` nor
``cluster.gpus_per_node`` was given on the command line, the request shrinks
to the most whole nodes that fit the share (or, below one node, to a part of
one node); a size the user typed is kept and checked as typed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from launcher.config.schema import QosConfig, RunConfig


def gpu_share(q: QosConfig, total_gpus: int) -> int:
    """GPUs a team may hold at once: its share of the cluster, at least 1."""
    return max(1, math.floor(total_gpus * q.cluster_share_pct / 100))


SIZE_KEYS = ("cluster.nodes", "cluster.gpus_per_node")


def _typed_keys(overrides: Iterable[str]) -> set[str]:
    """Config keys set on the command line (``key=v``, ``+key=v``, ``++key=v``, ``~key``)."""
    keys = set()
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        keys.add(key)
    return keys


def fit_to_qos_share(cfg: RunConfig, overrides: Iterable[str]) -> str | None:
    """Shrink ``cfg``'s request in place to its QOS share of a cluster of the
    preset's size; returns the line that says so, or None if nothing changed."""
    c, q = cfg.cluster, cfg.qos
    typed = _typed_keys(overrides)
    if c.kind != "slurm" or typed & set(SIZE_KEYS):
        return None
    total = c.nodes * c.gpus_per_node
    share = gpu_share(q, total)
    if total <= share:
        return None
    before = f"{c.nodes} node{'s' if c.nodes > 1 else ''} x {c.gpus_per_node} GPUs"
    if share >= c.gpus_per_node:
        c.nodes = share // c.gpus_per_node
    elif "launcher.exclusive" in typed and cfg.launcher.exclusive:
        return None  # exclusive nodes count all their GPUs: leave the refusal to the check
    else:
        # Part of one node: an exclusive node would count all its GPUs.
        c.nodes, c.gpus_per_node = 1, share
        cfg.launcher.exclusive = False
    return (
        f"qos={q.name} may hold {share} of this {total}-GPU cluster's GPUs ({q.cluster_share_pct:g}%): "
        f"asking for {c.nodes} node{'s' if c.nodes > 1 else ''} x {c.gpus_per_node} GPUs instead of {before} "
        "(set cluster.nodes / cluster.gpus_per_node, or another qos, to choose)"
    )
