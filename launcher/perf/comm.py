"""Alpha-beta cost of collectives on the links a parallel group crosses.

A collective over ``n`` ranks moving a tensor of ``size`` bytes (the full,
unsharded size for all-gather / reduce-scatter; the buffer for all-reduce):

- ring all-gather / reduce-scatter: ``(n-1) a + (n-1)/n * size / B``
- ring all-reduce: ``2 (n-1) a + 2 (n-1)/n * size / B``
- tree all-reduce: ``2 ceil(log2 n) a + 2 * size / B`` (NCCL picks the faster)
- point-to-point: ``a + size / B``

``B`` is the bus bandwidth of the slowest link the group crosses: NVLink (or
PCIe) inside a node. Across nodes NCCL runs one ring per NIC rail, each ring
crossing a node boundary on its own adapter, so a group with ``g`` ranks on
each node gets ``g`` GPUs' share of the fabric (adapters x rate / GPUs per
node, each), capped by NVLink: 8 GPUs of a node with 8 x 400 Gb/s see about
the node's 400 GB/s; an HSDP replica group (one rank per node) sees one NIC.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from launcher.config.schema import ClusterConfig
from launcher.perf.params import PerfParams


@dataclass(frozen=True)
class Link:
    name: str
    gb_per_s: float  # achieved bus bandwidth, GB/s
    latency_s: float

    def seconds(self, nbytes: float) -> float:
        return nbytes / (self.gb_per_s * 1e9)


def intra_node_link(c: ClusterConfig, device: str, p: PerfParams) -> Link:
    if device == "cpu":
        return Link("loopback", p.cpu_link_gb_per_s, p.cpu_link_latency_us * 1e-6)
    # intra_node_bandwidth_gb_per_s is bidirectional (NVLink 4: 900 = 2 x 450).
    per_direction = c.intra_node_bandwidth_gb_per_s / 2
    if c.intra_node_link == "nvlink" and per_direction > 0:
        return Link("nvlink", per_direction * p.nvlink_efficiency, p.nvlink_latency_us * 1e-6)
    # PCIe Gen5 x16: 64 GB/s per direction when the preset gives no figure.
    per_direction = per_direction or 64.0
    return Link("pcie", per_direction * p.pcie_efficiency, p.pcie_latency_us * 1e-6)


def inter_node_link(
    c: ClusterConfig, device: str, rpn: int, p: PerfParams, ranks_per_node_in_group: int = 1
) -> Link:
    """The fabric as seen by a group with ``ranks_per_node_in_group`` ranks on each node."""
    if device == "cpu":
        return Link("loopback", p.cpu_link_gb_per_s, p.cpu_link_latency_us * 1e-6)
    total_gb_per_s = c.fabric_adapters_per_node * c.fabric_adapter_gbit_per_s / 8
    if total_gb_per_s <= 0:
        # No fabric figure (single-node presets): a multi-node plan still needs
        # a number; assume one 100 Gb/s adapter and say so via the name.
        total_gb_per_s = 12.5
        name = f"{c.fabric} (assumed 100 Gb/s)"
    else:
        name = c.fabric
    per_gpu = total_gb_per_s / max(rpn, 1)
    rails = min(max(ranks_per_node_in_group, 1), max(rpn, 1))
    bw = rails * per_gpu * p.fabric_eff(c.fabric)
    intra = intra_node_link(c, device, p)
    if rails > 1:
        bw = min(bw, intra.gb_per_s)
    return Link(name, bw, p.fabric_latency_us * 1e-6)


def ring_all_gather(n: int, size: float, link: Link) -> float:
    if n <= 1 or size <= 0:
        return 0.0
    return (n - 1) * link.latency_s + (n - 1) / n * link.seconds(size)


ring_reduce_scatter = ring_all_gather


def all_reduce(n: int, size: float, link: Link) -> float:
    if n <= 1 or size <= 0:
        return 0.0
    ring = 2 * (n - 1) * link.latency_s + 2 * (n - 1) / n * link.seconds(size)
    tree = 2 * math.ceil(math.log2(n)) * link.latency_s + 2 * link.seconds(size)
    return min(ring, tree)


def p2p(size: float, link: Link) -> float:
    if size <= 0:
        return 0.0
    return link.latency_s + link.seconds(size)
