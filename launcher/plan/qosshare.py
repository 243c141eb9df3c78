"""A Slurm request and the QOS share, without changing either.

A cluster preset describes the cluster (``4node``: 4 nodes x 8 GPUs); a team
may hold only its QOS share of it (``qos=research``: 40%, 12 of 32 GPUs;
``python -m launcher.qos_admin sacctmgr`` renders the shares as GrpTRES). The
request is what the user asked for: ``cluster=4node`` asks for 4 nodes, and
meshrun never shrinks it. Whether the QOS allows it is the cluster's truth:
when Slurm is reachable the submission is checked against the QOS's live
limits (launcher/slurm/cluster.py ``check_request``) and refused before
anything is submitted. Where Slurm cannot be asked (a dry run on a laptop),
:func:`share_note` says what the preset's share would be, as a line of text.
"""

from __future__ import annotations

import math

from launcher.config.schema import QosConfig, RunConfig


def gpu_share(q: QosConfig, total_gpus: int) -> int:
    """GPUs a team may hold at once: its share of the cluster, at least 1."""
    return max(1, math.floor(total_gpus * q.cluster_share_pct / 100))


def request_gpus(cfg: RunConfig) -> int:
    """GPUs the request holds as Slurm counts them (GrpTRES gres/gpu): an
    exclusive node counts every GPU of the node, which the preset describes."""
    return cfg.cluster.nodes * cfg.cluster.gpus_per_node


def cluster_gpus(cfg: RunConfig) -> int:
    """GPUs of the cluster the preset describes (``cluster.cluster_nodes``
    nodes; the request's when the preset does not say)."""
    c = cfg.cluster
    return (c.cluster_nodes or c.nodes) * c.gpus_per_node


def share_note(cfg: RunConfig) -> str | None:
    """For a Slurm request checked without Slurm: the line that says the
    request is over the preset's QOS share of a cluster of the preset's size,
    and what would fit; None when it fits (or for local runs). Changes nothing."""
    c, q = cfg.cluster, cfg.qos
    if c.kind != "slurm":
        return None
    asked, total = request_gpus(cfg), cluster_gpus(cfg)
    share = gpu_share(q, total)
    if asked <= share:
        return None
    fit_nodes = share // c.gpus_per_node
    nodes = f"{c.nodes} node{'s' if c.nodes > 1 else ''} x {c.gpus_per_node} GPUs = {asked} GPUs"
    if c.cluster_nodes and c.nodes > c.cluster_nodes:
        # The preset's own size, never the request's: a request cannot grow the cluster.
        return (
            f"this request ({nodes}) is larger than cluster={c.name} itself ({c.cluster_nodes} nodes, "
            f"{total} GPUs; cluster.cluster_nodes); Slurm was not asked (not reachable from here), so "
            "nothing is refused and the request is kept as typed. Within the cluster: "
            f"cluster.nodes={c.cluster_nodes}; within qos={q.name}'s {q.cluster_share_pct:g}% share "
            f"({share} GPUs): cluster.nodes={max(1, fit_nodes)}, or a larger cluster preset"
        )
    if fit_nodes >= 1:
        fix = f"cluster.nodes={fit_nodes} ({fit_nodes * c.gpus_per_node} GPUs)"
    else:
        fix = f"cluster.nodes=1 cluster.gpus_per_node={share} launcher.exclusive=false"
    return (
        f"this request ({nodes}) "
        f"is over qos={q.name}'s share of cluster={c.name}'s {total} GPUs ({q.cluster_share_pct:g}%: {share} GPUs) "
        "where the QOS is set as conf/qos says (python -m launcher.qos_admin); Slurm was not asked "
        "(not reachable from here), so nothing is refused and the request is kept as typed. A submission "
        f"is checked against the cluster's real QOS limits first. Within the share: {fix}, or another qos"
    )
