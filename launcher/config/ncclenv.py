"""NCCL settings per fabric, and the environment every task gets.

A fabric preset (``cluster.fabric``) supplies NCCL variables, each with a
one-line reason. The cluster preset's ``env:`` block (conf/cluster/*.yaml) and
command-line overrides (``cluster.env.NCCL_DEBUG=INFO``) land in
``cluster.env`` and win over the fabric preset; an empty value
(``cluster.env.NCCL_NET_GDR_LEVEL=''``) removes a preset variable.

Precedence, lowest first: fabric preset < cluster preset env < command line.
:func:`task_env` returns the merged mapping; :func:`describe` says where each
value came from (shown by the dry run and ``python -m launcher.nccl``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from launcher.config.schema import ClusterConfig
from launcher.config.validate import ConfigError, fail


@dataclass(frozen=True)
class Setting:
    value: str
    reason: str


# Applied on every NCCL fabric (GPUs), before the fabric's own settings.
COMMON: dict[str, Setting] = {
    "NCCL_DEBUG": Setting("WARN", "problems only; cluster.env.NCCL_DEBUG=INFO shows rings, transports, GDR"),
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": Setting(
        "1", "a failed or timed-out collective aborts the rank instead of hanging until the time limit"
    ),
}

_IB_BASE: dict[str, Setting] = {
    "NCCL_IB_DISABLE": Setting("0", "use the InfiniBand verbs transport, not TCP sockets"),
    # NCCL_IB_HCA is filled in from cluster.fabric_adapters_per_node.
    "NCCL_NET_GDR_LEVEL": Setting(
        "PXB",
        "GPUDirect RDMA when GPU and NIC share a PCIe switch tree (HGX layout); the seed's 5 (SYS) "
        "would also force it across the CPU interconnect, where staging through host memory is faster",
    ),
    "NCCL_SOCKET_IFNAME": Setting(
        "^lo,docker", "bootstrap traffic on a real interface, never loopback or docker0"
    ),
}

FABRIC_PRESETS: dict[str, dict[str, Setting]] = {
    # CPU ranks (gloo) or an unknown fabric: NCCL is not used.
    "none": {},
    "nvlink_only": {
        "NCCL_IB_DISABLE": Setting("1", "one node: every byte rides NVLink/NVSwitch; keep NCCL off the NICs"),
        "NCCL_P2P_LEVEL": Setting("NVL", "peer-to-peer only over NVLink, never through PCIe host bridges"),
        "NCCL_NVLS_ENABLE": Setting(
            "1", "NVLink SHARP: all-reduce reductions inside the NVSwitch (H100/B200)"
        ),
    },
    "ib_hdr": {
        **_IB_BASE,
        "NCCL_IB_TIMEOUT": Setting(
            "22", "~17 s before a lost IB packet is an error: rides out fabric hiccups"
        ),
    },
    "ib_ndr": {
        **_IB_BASE,
        "NCCL_IB_TIMEOUT": Setting(
            "22", "~17 s before a lost IB packet is an error: rides out fabric hiccups"
        ),
        "NCCL_NVLS_ENABLE": Setting(
            "1", "NVLink SHARP inside the node before the NDR hop (Hopper/Blackwell)"
        ),
    },
    "roce_v2": {
        "NCCL_IB_DISABLE": Setting("0", "RoCE NICs use NCCL's IB verbs transport"),
        "NCCL_IB_GID_INDEX": Setting(
            "3", "the RoCE v2 (UDP/IPv4) GID on Mellanox NICs; index 0-1 are RoCE v1"
        ),
        "NCCL_IB_TC": Setting(
            "106", "traffic class of the lossless (PFC/ECN) queue; match the switch config"
        ),
        "NCCL_NET_GDR_LEVEL": _IB_BASE["NCCL_NET_GDR_LEVEL"],
        "NCCL_SOCKET_IFNAME": _IB_BASE["NCCL_SOCKET_IFNAME"],
    },
    "efa": {
        "FI_PROVIDER": Setting("efa", "libfabric on the EFA provider (aws-ofi-nccl plugin), not TCP"),
        "FI_EFA_USE_DEVICE_RDMA": Setting("1", "GPUDirect RDMA on p4d/p5 EFA devices"),
        "FI_EFA_FORK_SAFE": Setting("1", "data-loader workers fork after EFA is initialised"),
        "NCCL_SOCKET_IFNAME": Setting(
            "^lo,docker", "bootstrap on the ENA interface, never loopback or docker0"
        ),
    },
    "tcp": {
        "NCCL_IB_DISABLE": Setting("1", "no RDMA NICs: plain TCP sockets"),
        "NCCL_SOCKET_IFNAME": Setting("^lo,docker", "data on a real interface, never loopback or docker0"),
        "NCCL_SOCKET_NTHREADS": Setting("4", "more helper threads per connection to fill 100G+ Ethernet"),
        "NCCL_NSOCKS_PERTHREAD": Setting("4", "4 sockets per thread (threads x sockets must stay <= 64)"),
    },
}

# Share of the fabric's line rate an all-reduce's bus bandwidth reaches in
# practice (nccl-tests on healthy fabrics); the seed's "RoCE loses 15-20%".
FABRIC_EFFICIENCY: dict[str, float] = {
    "ib_hdr": 0.85,
    "ib_ndr": 0.85,
    "roce_v2": 0.70,
    "efa": 0.70,
    "tcp": 0.50,
    "nvlink_only": 0.80,
}

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def ib_hca(cluster: ClusterConfig) -> Setting:
    """``NCCL_IB_HCA`` for the node's adapters. The ``=`` prefix makes NCCL
    match names exactly: the seed's bare ``mlx5_1`` also matches ``mlx5_10``
    and up (storage NICs on many HGX nodes)."""
    names = ",".join(f"mlx5_{i}" for i in range(cluster.fabric_adapters_per_node))
    return Setting(
        f"={names}", f"exactly the {cluster.fabric_adapters_per_node} compute adapters, one per GPU"
    )


def preset(cluster: ClusterConfig) -> dict[str, Setting]:
    """The fabric preset for ``cluster`` (no overrides applied)."""
    if cluster.fabric not in FABRIC_PRESETS:
        raise fail("cluster.fabric", cluster.fabric, f"choose one of {', '.join(FABRIC_PRESETS)}")
    if cluster.fabric == "none":
        return {}
    out = dict(COMMON)
    out.update(FABRIC_PRESETS[cluster.fabric])
    if cluster.fabric in ("ib_hdr", "ib_ndr", "roce_v2") and cluster.fabric_adapters_per_node > 0:
        out["NCCL_IB_HCA"] = ib_hca(cluster)
    return out


def _check_env(env: dict[str, str]) -> None:
    for key in env:
        if not _ENV_NAME.match(str(key)):
            # The value is not shown: it may be a credential (launcher.config.secrets).
            raise ConfigError(
                f"cluster.env.{key} is invalid: environment variable names are letters, digits and _"
            )


def task_env(cluster: ClusterConfig) -> dict[str, str]:
    """The environment exported into every task: fabric preset, then
    ``cluster.env`` (preset YAML + command line) on top; empty values unset."""
    _check_env(cluster.env)
    merged = {k: s.value for k, s in preset(cluster).items()}
    for key, value in cluster.env.items():
        merged[key] = str(value)
    return {k: v for k, v in sorted(merged.items()) if v != ""}


def apply(cluster: ClusterConfig) -> None:
    """Resolve ``cluster.env`` in place to :func:`task_env`, so everything that
    exports it (sbatch rendering, the local runner) and the recorded
    config.yaml see the merged settings."""
    cluster.env = task_env(cluster)


def describe(cluster: ClusterConfig) -> list[tuple[str, str, str, str]]:
    """(variable, value, source, reason) for each exported variable; source
    is ``fabric:<name>`` or ``cluster.env`` (preset YAML or command line)."""
    base = preset(cluster)
    rows = []
    for key, value in task_env(cluster).items():
        if key in cluster.env:
            src = "cluster.env"
            reason = (
                base[key].reason if key in base and base[key].value == value else "set by the cluster or CLI"
            )
        else:
            src, reason = f"fabric:{cluster.fabric}", base[key].reason
        rows.append((key, value, src, reason))
    removed = [k for k, v in cluster.env.items() if v == "" and k in base]
    rows += [(k, "(unset)", "cluster.env", f"removed from fabric:{cluster.fabric}") for k in removed]
    return rows


def expected_busbw_gb_per_s(cluster: ClusterConfig, nodes: int | None = None) -> float:
    """All-reduce bus bandwidth a healthy fabric reaches (GB/s), 0 when there
    is no figure to hold it to (CPU ranks, unknown links).

    Across nodes the NICs bound it (adapters x line rate); inside one node
    NVLink does (the quoted bidirectional figure / 2 per direction)."""
    if cluster.expected_busbw_gb_per_s > 0:
        return cluster.expected_busbw_gb_per_s
    nodes = cluster.nodes if nodes is None else nodes
    if cluster.gpus_per_node == 0 or cluster.fabric == "none":
        return 0.0
    if nodes > 1 and cluster.fabric in FABRIC_EFFICIENCY and cluster.fabric != "nvlink_only":
        line_gb_per_s = cluster.fabric_adapters_per_node * cluster.fabric_adapter_gbit_per_s / 8.0
        return round(line_gb_per_s * FABRIC_EFFICIENCY[cluster.fabric], 1)
    if cluster.intra_node_bandwidth_gb_per_s > 0 and cluster.gpus_per_node > 1:
        return round(cluster.intra_node_bandwidth_gb_per_s / 2.0 * FABRIC_EFFICIENCY["nvlink_only"], 1)
    return 0.0
