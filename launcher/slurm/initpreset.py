"""Cluster and QOS presets from what :mod:`launcher.slurm.discover` read.

The presets hold only fields of ``ClusterConfig`` / ``QosConfig``
(launcher/config/schema.py); what the cluster cannot say (GPU memory and
peak of an unknown GPU type, prices) stays at the schema's default and is
named in the notes, so the user knows what to set.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from launcher.config.schema import ClusterConfig, QosConfig
from launcher.slurm.discover import ClusterFacts, Partition

# GRES type (lower case, matched as a prefix) -> gpu_type, HBM GB, dense bf16 TFLOPS,
# as the bundled presets (conf/cluster/) give them.
KNOWN_GPUS = {
    "h100": ("H100-80GB-SXM", 80, 989),
    "h200": ("H200-141GB", 141, 989),
    "a100": ("A100-80GB-SXM", 80, 312),
    "b200": ("B200-192GB", 192, 2250),
}
# InfiniBand rate (Gbit/s per port) -> fabric choice.
IB_FABRIC = [(400, "ib_ndr"), (200, "ib_hdr")]


def cluster_preset(facts: ClusterFacts, name: str, sets: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The cluster preset and the notes on what it could not know."""
    n = facts.node
    notes: list[str] = []
    p: dict[str, Any] = {
        "name": name,
        "kind": "slurm",
        "nodes": 1,
        "cluster_nodes": max((q.total_nodes for q in facts.partitions), default=n.count),
        "gpus_per_node": n.gpus,
        "node_gpus": n.gpus,  # what the node has: gpus_per_node may be set lower (a shared node)
        "cpus_per_node": n.cpus,
        "mem_per_node_gb": round(n.mem_gb),
        "pyxis": facts.pyxis,
    }
    known = next((v for k, v in KNOWN_GPUS.items() if n.gres_type.lower().startswith(k)), None)
    if known:
        p["gpu_type"], p["gpu_mem_gb"], p["gpu_peak_bf16_tflops"] = known
    else:
        p["gpu_type"] = n.gres_type or "gpu"
        if "gpu_mem_gb" not in sets:
            notes.append(
                f"GPU type {n.gres_type or '(untyped GRES gpu)'} is not one meshrun knows: "
                "set gpu_mem_gb=GB (and gpu_peak_bf16_tflops=T for MFU)"
            )
    p.update(_fabric(facts, notes))
    if not facts.pyxis:
        notes.append("no Pyxis in the plugstack: jobs run without containers (pyxis: false)")
    notes.append("prices unknown: set price_on_demand_usd_per_node_hour=... for cost estimates")
    p.update(sets)
    return p, notes


def _fabric(facts: ClusterFacts, notes: list[str]) -> dict[str, Any]:
    if not facts.nics:
        notes.append(
            "no InfiniBand NICs on this node: fabric tcp (set fabric=... if the compute nodes differ)"
        )
        return {"fabric": "tcp"}
    if facts.nic_link == "Ethernet":
        fabric = "roce_v2"
    else:
        fabric = next((f for rate, f in IB_FABRIC if facts.nic_rate_gbit >= rate), "ib_hdr")
    out: dict[str, Any] = {
        "fabric": fabric,
        "fabric_adapters_per_node": len(facts.nics),
        "fabric_adapter_gbit_per_s": facts.nic_rate_gbit,
    }
    if facts.nics != [f"mlx5_{i}" for i in range(len(facts.nics))]:
        out["env"] = {"NCCL_IB_HCA": "=" + ",".join(facts.nics)}
    return out


def _usable(facts: ClusterFacts, part: Partition) -> tuple[str, str] | None:
    """The (account, QOS) the user may run in ``part`` with, or None."""
    for a in facts.associations:
        if a.partition not in ("", part.name):
            continue
        if "ALL" not in part.allow_accounts and a.account not in part.allow_accounts:
            continue
        allowed = [q for q in a.qos if "ALL" in part.allow_qos or q in part.allow_qos]
        if allowed:
            return a.account, a.default_qos if a.default_qos in allowed else allowed[0]
    return None


def qos_presets(facts: ClusterFacts, name: str) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """One QOS preset per partition the user may submit to (``<name>_<partition>``)."""
    out: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    for part in sorted(facts.partitions, key=lambda p: not p.default):  # the default partition first
        usable = _usable(facts, part)
        if usable is None:
            notes.append(f"partition {part.name}: no account/QOS of yours is allowed there; no preset")
            continue
        account, qos_name = usable
        q = facts.qos.get(qos_name)
        limits = [m for m in (part.max_time_min, q.max_wall_min if q else None) if m]
        share = 100.0
        if q and q.gpu_limit is not None and facts.total_gpus:
            share = min(100.0, round(100.0 * q.gpu_limit / facts.total_gpus, 2))
        preset = f"{name}_{part.name}"
        out[preset] = {
            "name": preset,
            "partition": part.name,
            "qos": qos_name,
            "account": account,
            "time_limit_min": int(min(limits)) if limits else QosConfig.time_limit_min,
            "cluster_share_pct": share,
            "priority": q.priority if q else 0,
            "preempts": list(q.preempts) if q else [],
            "grace_time_s": q.grace_time_s if q else 0,
        }
    return out, notes


def field_names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def cluster_field_sets(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` arguments as cluster preset values (YAML-typed); an
    unknown key raises ValueError naming the valid ones."""
    import yaml

    out: dict[str, Any] = {}
    valid = field_names(ClusterConfig)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in valid:
            raise ValueError(
                f"{pair!r} is not FIELD=VALUE of a cluster field; fields: {', '.join(sorted(valid))}"
            )
        out[key] = yaml.safe_load(value) if value else ""
    return out


def found_lines(facts: ClusterFacts) -> list[str]:
    """What was read, one fact per line."""
    n, c = facts.node, facts.config
    lines = [
        f"cluster      {facts.name}: {n.count} node(s) like this one, {facts.total_gpus} GPUs in all",
        f"node         {n.gpus} GPU(s) (GRES type {n.gres_type or 'untyped'}), {n.cpus} CPUs, "
        f"{n.mem_gb:.0f} GB RAM, features {','.join(n.features) or 'none'}",
    ]
    for part in facts.partitions:
        limit = f"{part.max_time_min:.0f} min" if part.max_time_min else "no time limit"
        lines.append(
            f"partition    {part.name}{' (default)' if part.default else ''}: {part.total_nodes} nodes "
            f"{part.nodes}, {limit}, QOS {','.join(part.allow_qos)}, accounts {','.join(part.allow_accounts)}"
        )
    for q in facts.qos.values():
        gpus = f"{q.gpu_limit} GPUs" if q.gpu_limit is not None else "no GPU limit"
        wall = f"{q.max_wall_min:.0f} min" if q.max_wall_min else "no wall limit"
        preempts = f", preempts {','.join(q.preempts)}" if q.preempts else ""
        lines.append(
            f"qos          {q.name}: priority {q.priority}, {gpus}, {wall}, grace {q.grace_time_s} s{preempts}"
        )
    for a in facts.associations:
        lines.append(
            f"account      {a.account}: QOS {','.join(a.qos) or '-'} (default {a.default_qos or '-'}), "
            f"partition {a.partition or 'any'}"
        )
    lines += [
        f"config       MaxArraySize {c.get('MaxArraySize', '?')}, {c.get('PreemptType', '?')} "
        f"{c.get('PreemptMode', '')}, preemption sends {facts.preempt_signal}",
        f"config       Prolog {c.get('Prolog', '(null)')}, Epilog {c.get('Epilog', '(null)')}, "
        f"Pyxis {'in' if facts.pyxis else 'not in'} {c.get('PlugStackConfig', 'plugstack.conf')}",
        f"network      {', '.join(facts.nics) or 'no InfiniBand NICs'}"
        + (f" ({facts.nic_rate_gbit:g} Gbit/s, {facts.nic_link})" if facts.nics else ""),
        f"containers   {facts.enroot or 'no enroot on PATH'}",
    ]
    return lines
