"""What a Slurm cluster is, read from the cluster itself (``meshrun init``).

Read-only queries: ``scontrol show partition|node|config``, ``sacctmgr show
qos|assoc`` for the user, the node's InfiniBand devices
(``/sys/class/infiniband``, ``ibstat`` where that is missing) and the
container runtime (``enroot``). The parsers take the commands' text so they
are tested on their own; :func:`discover` runs the commands.
"""

from __future__ import annotations

import getpass
import re
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from launcher.config.validate import Login
from launcher.slurm.cluster import _kv, _minutes, _tres, run
from launcher.slurm.discoverssh import host_facts, loads_pyxis, remote_pyxis
from launcher.slurm.remote import remote_user


@dataclass
class Partition:
    name: str
    nodes: str  # Slurm's node expression, e.g. node[1-4]
    total_nodes: int
    max_nodes: int | None  # per job; None: no limit
    max_time_min: float | None
    allow_qos: list[str]  # ["ALL"]: any
    allow_accounts: list[str]
    default: bool


@dataclass
class NodeShape:
    """The most common node of the cluster (``count`` of them)."""

    count: int
    gpus: int
    gres_type: str  # the GRES type (gpu:h100:8 -> h100); "" when untyped
    cpus: int
    mem_gb: float
    features: list[str]


@dataclass
class Qos:
    name: str
    priority: int
    gpu_limit: int | None  # GrpTRES gres/gpu
    max_wall_min: float | None
    preempts: list[str]
    grace_time_s: int


@dataclass
class Association:
    account: str
    partition: str  # "": every partition
    qos: list[str]
    default_qos: str


@dataclass
class ClusterFacts:
    name: str
    partitions: list[Partition]
    node: NodeShape
    total_gpus: int
    qos: dict[str, Qos]
    associations: list[Association]
    config: dict[str, str]  # the scontrol show config keys meshrun reads
    pyxis: bool
    nics: list[str] = field(default_factory=list)
    nic_rate_gbit: float = 0.0
    nic_link: str = ""  # InfiniBand | Ethernet
    enroot: str = ""  # enroot's path and version, "" when absent

    @property
    def preempt_signal(self) -> str:
        params = self.config.get("PreemptParameters", "") + self.config.get("SlurmctldParameters", "")
        if "send_user_signal" in params:
            return "the job's --signal (USR2: meshrun checkpoints and is requeued)"
        return "SIGTERM (Slurm's default; meshrun asks Slurm whether the job was preempted)"


def _names(value: str) -> list[str]:
    return [v for v in value.split(",") if v and v != "(null)"]


def parse_partitions(text: str) -> list[Partition]:
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        kv = _kv(line)
        max_nodes = kv.get("MaxNodes", "UNLIMITED")
        out.append(
            Partition(
                name=kv["PartitionName"],
                nodes=kv.get("Nodes", ""),
                total_nodes=int(kv.get("TotalNodes", "0") or 0),
                max_nodes=None if not max_nodes.isdigit() else int(max_nodes),
                max_time_min=_minutes(kv.get("MaxTime", "")),
                allow_qos=_names(kv.get("AllowQos", "ALL")) or ["ALL"],
                allow_accounts=_names(kv.get("AllowAccounts", "ALL")) or ["ALL"],
                default=kv.get("Default") == "YES",
            )
        )
    return out


def gres_gpus(gres: str) -> tuple[int, str]:
    """GPUs and their type from a node's ``Gres`` (``gpu:h100:8(S:0-1)``, ``gpu:8``)."""
    m = re.search(r"gpu(?::([^:(,]+))?:(\d+)", gres or "")
    return (int(m.group(2)), m.group(1) or "") if m else (0, "")


def parse_nodes(text: str) -> tuple[NodeShape, int]:
    """The most common node shape and the cluster's GPUs in all."""
    shapes: Counter[tuple[int, str, int, float, tuple[str, ...]]] = Counter()
    total_gpus = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        kv = _kv(line)
        gpus, kind = gres_gpus(kv.get("Gres", ""))
        total_gpus += gpus
        feats = tuple(_names(kv.get("AvailableFeatures", "")))
        cpus = int(kv.get("CPUTot", "0") or 0)
        mem_gb = int(kv.get("RealMemory", "0") or 0) / 1024
        shapes[(gpus, kind, cpus, mem_gb, feats)] += 1
    if not shapes:
        return NodeShape(0, 0, "", 0, 0.0, []), 0
    (gpus, kind, cpus, mem_gb, feats), n = shapes.most_common(1)[0]
    return NodeShape(n, gpus, kind, cpus, mem_gb, list(feats)), total_gpus


QOS_FIELDS = ["Name", "Priority", "GrpTRES", "MaxWall", "Preempt", "GraceTime"]
ASSOC_FIELDS = ["Account", "Partition", "QOS", "DefaultQOS"]


def parse_qos(text: str) -> dict[str, Qos]:
    out = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        r = dict(zip(QOS_FIELDS, line.split("|"), strict=False))
        grace = _minutes(r.get("GraceTime", "")) or 0.0
        out[r["Name"]] = Qos(
            name=r["Name"],
            priority=int(r.get("Priority") or 0),
            gpu_limit=_tres(r.get("GrpTRES", ""), "gres/gpu"),
            max_wall_min=_minutes(r.get("MaxWall", "")),
            preempts=_names(r.get("Preempt", "")),
            grace_time_s=round(grace * 60),
        )
    return out


def parse_assoc(text: str) -> list[Association]:
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        r = dict(zip(ASSOC_FIELDS, line.split("|"), strict=False))
        out.append(
            Association(
                r["Account"], r.get("Partition", ""), _names(r.get("QOS", "")), r.get("DefaultQOS", "")
            )
        )
    return out


def parse_config(text: str) -> dict[str, str]:
    keys = [
        "ClusterName",
        "MaxArraySize",
        "PreemptType",
        "PreemptMode",
        "PreemptParameters",
        "SlurmctldParameters",
        "Prolog",
        "Epilog",
        "PlugStackConfig",
    ]
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() in keys:
            out[key.strip()] = value.strip()
    return out


def plugstack_has_pyxis(path: str) -> bool:
    """Does the SPANK plugstack (or a file it includes) load Pyxis?"""
    p = Path(path or "/etc/slurm/plugstack.conf")
    files = [p, *sorted(p.parent.glob("plugstack.conf.d/*"))]
    for f in files:
        try:
            text = f.read_text()
        except OSError:
            continue
        if loads_pyxis(text):
            return True
    return False


def infiniband(root: Path = Path("/sys/class/infiniband")) -> tuple[list[str], float, str]:
    """NIC names, the first port's rate in Gbit/s and its link layer."""
    if not root.is_dir():
        return _ibstat()
    names = sorted(p.name for p in root.iterdir())
    rate, link = 0.0, ""
    for name in names:
        port = root / name / "ports" / "1"
        try:
            m = re.match(r"([\d.]+)", (port / "rate").read_text())
            rate = float(m.group(1)) if m else 0.0
            link = (port / "link_layer").read_text().strip()
        except OSError:
            continue
        break
    return names, rate, link


def _ibstat() -> tuple[list[str], float, str]:
    if shutil.which("ibstat") is None:
        return [], 0.0, ""
    out = subprocess.run(["ibstat"], capture_output=True, text=True, timeout=20, check=False).stdout
    names = re.findall(r"^CA '([^']+)'", out, re.M)
    rate = re.search(r"Rate:\s*([\d.]+)", out)
    link = re.search(r"Link layer:\s*(\S+)", out)
    return names, float(rate.group(1)) if rate else 0.0, link.group(1) if link else ""


def enroot_version() -> str:
    path = shutil.which("enroot")
    if path is None:
        return ""
    out = subprocess.run([path, "version"], capture_output=True, text=True, timeout=20, check=False)
    return f"{path} {out.stdout.strip()}".strip()


def discover(
    user: str | None = None, ib_root: Path = Path("/sys/class/infiniband"), *, login: Login | None = None
) -> ClusterFacts:
    """Ask the cluster (raises SlurmUnavailable / SlurmError, one line each);
    ``login``: the one behind that login node, over ssh (its user, NICs, enroot, plugstack)."""
    on = str(login) if login else ""
    if login:
        user = user or remote_user(login)
    user = user or getpass.getuser()
    config = parse_config(run(["scontrol", "show", "config"], login=on).stdout)
    partitions = parse_partitions(run(["scontrol", "-o", "show", "partition"], login=on).stdout)
    node, total_gpus = parse_nodes(run(["scontrol", "-o", "show", "node"], login=on).stdout)
    qos_cmd = ["sacctmgr", "-n", "-P", "show", "qos", f"format={','.join(QOS_FIELDS)}"]
    qos = parse_qos(run(qos_cmd, login=on).stdout)
    assoc_cmd = ["sacctmgr", "-n", "-P", "show", "assoc", "where", f"user={user}"]
    assoc = parse_assoc(run([*assoc_cmd, f"format={','.join(ASSOC_FIELDS)}"], login=on).stdout)
    if login:
        nics, rate, link, enroot = host_facts(login)
        pyxis = remote_pyxis(login, config.get("PlugStackConfig", ""))
    else:
        nics, rate, link = infiniband(ib_root)
        pyxis, enroot = plugstack_has_pyxis(config.get("PlugStackConfig", "")), enroot_version()
    return ClusterFacts(
        name=config.get("ClusterName", "cluster"),
        partitions=partitions,
        node=node,
        total_gpus=total_gpus,
        qos=qos,
        associations=assoc,
        config=config,
        pyxis=pyxis,
        nics=nics,
        nic_rate_gbit=rate,
        nic_link=link,
        enroot=enroot,
    )
