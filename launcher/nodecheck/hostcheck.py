"""The checks of one node against its cluster preset, each pass / warn /
fail / skip with a reason: GPU count and model (NVML), NVLink between every
GPU pair (``nvidia-smi topo -m``), InfiniBand adapters active at the expected
rate (``ibstat``, ``ibdev2netdev -v``), scratch free space, RAM, S3 reachable
with the credentials present; and the parsers of those tools' output (tested
on recorded outputs in tests/data/preflight/). :mod:`launcher.nodecheck.nodepreflight`
runs them on every node of a job and reports.

Importing this module does not import torch (launcher rule).
"""

import contextlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from launcher.config.schema import RunConfig

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
# Bytes per parameter in a DCP checkpoint: fp32 weights + AdamW's two fp32
# moments (bf16 runs keep fp32 masters under FSDP2's mixed precision).
CKPT_BYTES_PER_PARAM = 12


@dataclass
class Check:
    name: str
    status: str
    detail: str


# --- parsers (tested on recorded outputs in tests/data/preflight/) ---------

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def parse_topo_matrix(text: str) -> dict[tuple[int, int], str]:
    """``nvidia-smi topo -m`` -> {(gpu_i, gpu_j): link} for i != j, where link
    is ``NV<n>``, ``PIX``, ``PXB``, ``PHB``, ``NODE`` or ``SYS``."""
    lines = [_ANSI.sub("", line).rstrip("\n") for line in text.splitlines()]
    header = next(
        (line for line in lines if re.search(r"\bGPU0\b", line) and not line.startswith("GPU")), None
    )
    if header is None:
        raise ValueError("no GPU header row in nvidia-smi topo -m output")
    cols = [c.strip() for c in header.split("\t")]
    gpu_cols = {i: int(c[3:]) for i, c in enumerate(cols) if re.fullmatch(r"GPU\d+", c)}
    links: dict[tuple[int, int], str] = {}
    for line in lines:
        m = re.match(r"^GPU(\d+)\t", line)
        if not m:
            continue
        cells = [c.strip() for c in line.split("\t")]
        row = int(m.group(1))
        for i, gpu in gpu_cols.items():
            if gpu != row and i < len(cells):
                links[(row, gpu)] = cells[i]
    return links


def check_nvlink(links: dict[tuple[int, int], str], n_gpus: int) -> Check:
    gpus = sorted({i for i, _ in links})
    if len(gpus) < n_gpus:
        return Check("nvlink", FAIL, f"topology shows {len(gpus)} GPUs, expected {n_gpus}")
    bad = sorted(f"GPU{i}-GPU{j}:{v}" for (i, j), v in links.items() if i < j and not v.startswith("NV"))
    if bad:
        shown = ", ".join(bad[:6]) + (f" (+{len(bad) - 6} more)" if len(bad) > 6 else "")
        return Check("nvlink", FAIL, f"{len(bad)} GPU pairs not on NVLink: {shown}")
    widths = sorted({v for v in links.values()})
    return Check(
        "nvlink", PASS, f"all {len(gpus) * (len(gpus) - 1) // 2} GPU pairs on NVLink ({'/'.join(widths)})"
    )


@dataclass
class IbPort:
    ca: str
    port: int
    state: str  # Active / Down / Init ...
    physical_state: str = ""
    rate_gbit: float = 0.0
    link_layer: str = ""
    netdev: str = ""


def parse_ibstat(text: str) -> list[IbPort]:
    ports: list[IbPort] = []
    ca = ""
    cur: IbPort | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if m := re.match(r"^CA '([^']+)'", line):
            ca, cur = m.group(1), None
        elif m := re.match(r"^Port (\d+):$", line):
            cur = IbPort(ca=ca, port=int(m.group(1)), state="")
            ports.append(cur)
        elif cur is not None and ":" in line:
            key, value = (s.strip() for s in line.split(":", 1))
            if key == "State":
                cur.state = value
            elif key == "Physical state":
                cur.physical_state = value
            elif key == "Rate":
                cur.rate_gbit = float(value.split()[0])
            elif key == "Link layer":
                cur.link_layer = value
    return ports


_IBDEV = re.compile(
    r"(?P<ca>mlx\d+_\d+)\b.*?\bport (?P<port>\d+) \((?P<state>[A-Z_]+)\) ==> (?P<netdev>\S+) \((?P<up>\w+)\)"
)


def parse_ibdev2netdev(text: str) -> list[IbPort]:
    """``ibdev2netdev`` / ``-v`` lines -> ports with state and netdev (no rate:
    ``-v`` prints the card's model, not the negotiated link)."""
    out = []
    for line in text.splitlines():
        if m := _IBDEV.search(line):
            state = "Active" if m.group("state") == "ACTIVE" else m.group("state").title()
            out.append(IbPort(m.group("ca"), int(m.group("port")), state, netdev=m.group("netdev")))
    return out


def expected_hcas(cfg: RunConfig) -> list[str]:
    """Adapter names from NCCL_IB_HCA (``=mlx5_0,mlx5_1:1``), else none."""
    spec = cfg.cluster.env.get("NCCL_IB_HCA", "")
    if not spec or spec.startswith("^"):
        return []
    return [item.split(":")[0] for item in spec.lstrip("=").split(",") if item]


def check_ib(ports: list[IbPort], cfg: RunConfig, source: str) -> Check:
    c = cfg.cluster
    layer = "Ethernet" if c.fabric == "roce_v2" else "InfiniBand"
    want = expected_hcas(cfg)
    mine = [p for p in ports if (p.ca in want if want else p.link_layer in ("", layer))]
    if want:
        missing = sorted(set(want) - {p.ca for p in mine})
        if missing:
            return Check("infiniband", FAIL, f"adapters missing: {', '.join(missing)} ({source})")
    down = [f"{p.ca}/{p.port}:{p.state or '?'}" for p in mine if p.state != "Active"]
    slow = [
        f"{p.ca}/{p.port}:{p.rate_gbit:g}G"
        for p in mine
        if p.state == "Active" and p.rate_gbit and p.rate_gbit < c.fabric_adapter_gbit_per_s
    ]
    active = len(mine) - len(down)
    problems = []
    if active < c.fabric_adapters_per_node:
        problems.append(f"{active}/{c.fabric_adapters_per_node} active")
    if down:
        problems.append("down: " + ", ".join(down))
    if slow:
        problems.append(f"below {c.fabric_adapter_gbit_per_s:g} Gb/s: " + ", ".join(slow))
    if problems:
        return Check("infiniband", FAIL, "; ".join(problems) + f" ({source})")
    rated = all(p.rate_gbit for p in mine)
    detail = f"{active} {layer} ports active" + (f" at {c.fabric_adapter_gbit_per_s:g} Gb/s" if rated else "")
    if not rated:
        return Check(
            "infiniband", WARN, detail + f"; rate not verified ({source} has no rate; install ibstat)"
        )
    return Check("infiniband", PASS, f"{detail} ({source})")


# --- checks on this node ---------------------------------------------------


def _run(cmd: list[str], timeout_s: float = 30.0) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return None


def gpu_inventory() -> tuple[list[str], str]:
    """(GPU names, source) from NVML, falling back to nvidia-smi."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            names = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
                names.append(name.decode() if isinstance(name, bytes) else name)
            return names, "NVML"
        finally:
            pynvml.nvmlShutdown()
    except ImportError:
        pass
    except Exception:  # pynvml.NVMLError subclasses: no driver / library here
        return [], "NVML (no driver)"
    out = _run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"])
    if out is None:
        return [], "no NVML, no nvidia-smi"
    return [line.strip() for line in out.splitlines() if line.strip()], "nvidia-smi"


def gpu_model_matches(expected: str, name: str) -> bool:
    """``H100-80GB-SXM`` vs NVML's ``NVIDIA H100 80GB HBM3``: the model token
    (first part of the preset's gpu_type) must appear in the name."""
    token = re.split(r"[-_ ]", expected.strip())[0].upper()
    return bool(token) and token in name.upper()


def check_gpus(cfg: RunConfig, device: str, names: list[str], source: str) -> Check:
    c = cfg.cluster
    if device != "cuda":
        return Check("gpus", SKIP, f"CPU ranks (gloo); {len(names)} GPUs seen ({source})")
    if len(names) < c.gpus_per_node:
        return Check("gpus", FAIL, f"{len(names)} GPUs found ({source}), the preset needs {c.gpus_per_node}")
    wrong = sorted({n for n in names if not gpu_model_matches(c.gpu_type, n)})
    if wrong:
        return Check("gpus", FAIL, f"expected {c.gpu_type}, found {', '.join(wrong)} ({source})")
    extra = f" ({len(names) - c.gpus_per_node} more than the preset)" if len(names) > c.gpus_per_node else ""
    return Check("gpus", PASS, f"{len(names)} x {names[0]}{extra} ({source})")


def dir_size_bytes(path: str) -> int:
    p = Path(path)
    if p.is_file():
        return p.stat().st_size
    total = 0
    for root, _, files in os.walk(p):
        for f in files:
            with contextlib.suppress(OSError):  # a file removed while walking
                total += os.stat(os.path.join(root, f)).st_size
    return total


def _existing(path: str) -> str:
    p = Path(path).resolve()
    while not p.exists():
        p = p.parent
    return str(p)


def check_space(cfg: RunConfig, params: int, nodes: int, checkpoint_dir: str) -> Check:
    """Scratch free >= 2x the dataset (plus checkpoints when they share the
    filesystem) plus cluster.preflight_min_free_gb."""
    c, s = cfg.cluster, cfg.storage
    data_bytes = dir_size_bytes(cfg.data.path) if cfg.data.path and Path(cfg.data.path).exists() else 0
    ckpt_node = params * CKPT_BYTES_PER_PARAM / max(nodes, 1)  # this node's shards
    ckpt_bytes = ckpt_node * (s.keep_local + 1)  # kept ones + the one being written
    extra = c.preflight_min_free_gb * 1e9
    scratch, ckpt = _existing(c.scratch_path or "/tmp"), _existing(checkpoint_dir)
    needs = {scratch: 2 * data_bytes + extra}
    same_fs = os.stat(scratch).st_dev == os.stat(ckpt).st_dev
    needs[scratch if same_fs else ckpt] = needs.get(scratch if same_fs else ckpt, 0) + ckpt_bytes
    rows, status = [], PASS
    for path, need in needs.items():
        free = shutil.disk_usage(path).free
        rows.append(f"{path}: {free / 1e9:.1f} GB free, needs {need / 1e9:.1f} GB")
        if free < need:
            status = FAIL
    why = (
        f"2x dataset {data_bytes / 1e9:.2f} GB + {s.keep_local + 1} checkpoints x {ckpt_node / 1e9:.2f} GB"
        + (f" + preflight_min_free_gb {c.preflight_min_free_gb:g}" if extra else "")
    )
    return Check("scratch", status, "; ".join(rows) + f" ({why})")


def meminfo_gb(text: str | None = None) -> tuple[float, float]:
    """(MemTotal, MemAvailable) from /proc/meminfo, in GB of 1024 MiB: the
    unit of Slurm's RealMemory (MiB) / 1024, which `meshrun init` writes as
    cluster.mem_per_node_gb, so the check compares like with like."""
    if text is None:
        text = Path("/proc/meminfo").read_text()
    vals = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("MemTotal", "MemAvailable"):
            vals[key] = float(rest.split()[0]) / 2**20  # kB -> GiB
    return vals.get("MemTotal", 0.0), vals.get("MemAvailable", 0.0)


@dataclass
class SlurmMemory:
    """This node's memory as Slurm gives it: RealMemory in GB (MiB / 1024),
    and whether slurmd runs with ``SlurmdParameters=config_overrides`` (the
    configured figures stand for the hardware's: a node with less is not
    drained, as on the test cluster, whose 4 nodes share one host)."""

    node: str
    gb: float
    overrides: bool


def slurm_memory() -> SlurmMemory | None:
    """Slurm's figure for the node this runs on (SLURMD_NODENAME); None outside a job or when Slurm cannot say."""
    from launcher.slurm.nodestate import node_info, slurm_cmd

    node = os.environ.get("SLURMD_NODENAME", "")
    real = node_info(node).get("RealMemory", "") if node else ""
    if not real.isdigit() or int(real) <= 1:  # 1: Slurm's default when not configured
        return None
    conf = slurm_cmd(["scontrol", "show", "config"]).stdout
    params = re.search(r"^SlurmdParameters\s*=\s*(\S*)", conf, re.M)
    return SlurmMemory(node, int(real) / 1024, bool(params and "config_overrides" in params.group(1)))


def check_ram(cfg: RunConfig, total_gb: float, avail_gb: float, slurm: SlurmMemory | None = None) -> Check:
    """The preset's cluster.mem_per_node_gb against Slurm's RealMemory for
    this node (both Slurm's figure, as `meshrun init` writes it), and the
    host's MemTotal against that, unless Slurm is told its figures override
    the hardware's (then short memory warns, never fails a burn-in)."""
    want = cfg.cluster.mem_per_node_gb
    detail = f"{total_gb:.1f} GB total, {avail_gb:.1f} GB available (preset {want:g} GB"
    detail += f", Slurm's RealMemory for {slurm.node} {slurm.gb:g} GB)" if slurm else ")"
    if slurm and want > slurm.gb + 0.5:  # init rounds RealMemory to whole GB
        fix = (
            f"; the preset claims more than Slurm gives this node: set cluster.mem_per_node_gb={slurm.gb:.0f}"
        )
        return Check("ram", FAIL, detail + fix + " (what `meshrun init` writes from Slurm's RealMemory)")
    if slurm and slurm.overrides:
        if total_gb < 0.9 * want:
            note = (
                "; SlurmdParameters=config_overrides: Slurm's figure is nominal, this host is not held to it"
            )
            return Check("ram", WARN, detail + note)
        return Check("ram", PASS, detail)
    if total_gb < 0.5 * want:
        # Said with the fix: the preset claims more memory than the machine has
        # (a burn-in failed every minute on this with no hint of what to change).
        fix = (
            f"; if this node is as it should be, the preset is wrong: set cluster.mem_per_node_gb={total_gb:.0f} "
            "(what `meshrun init` writes from Slurm's RealMemory)"
        )
        return Check("ram", FAIL, detail + fix)
    if total_gb < 0.9 * want or avail_gb < 0.5 * total_gb:
        return Check("ram", WARN, detail)
    return Check("ram", PASS, detail)


def check_s3(cfg: RunConfig) -> Check:
    s = cfg.storage
    if not s.s3_bucket:
        return Check("s3", SKIP, "storage has no S3 tier")
    bad = FAIL if s.s3_required else WARN
    try:
        import boto3
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        return Check("s3", bad, "boto3 is not installed")
    session = boto3.session.Session()
    if session.get_credentials() is None:
        return Check("s3", bad, f"no AWS credentials for s3://{s.s3_bucket} (env, ~/.aws, instance role)")
    client = session.client(
        "s3",
        endpoint_url=s.s3_endpoint_url or None,
        region_name=s.s3_region,
        config=Config(connect_timeout=5, read_timeout=10, retries={"max_attempts": 2}),
    )
    where = f"s3://{s.s3_bucket}" + (f" at {s.s3_endpoint_url}" if s.s3_endpoint_url else "")
    try:
        client.head_bucket(Bucket=s.s3_bucket)
    except ClientError as e:
        return Check("s3", bad, f"{where}: {e.response.get('Error', {}).get('Code', 'error')}")
    except BotoCoreError as e:
        return Check("s3", bad, f"{where}: {e}")
    return Check("s3", PASS, f"{where} reachable (head_bucket)")


def node_checks(cfg: RunConfig, *, device: str, params: int, checkpoint_dir: str) -> list[Check]:
    """Every node-level check for ``cfg`` on this machine."""
    c = cfg.cluster
    checks = [check_gpus(cfg, device, *gpu_inventory())]
    if device == "cuda" and c.intra_node_link == "nvlink" and c.gpus_per_node > 1:
        out = _run(["nvidia-smi", "topo", "-m"])
        if out is None:
            checks.append(Check("nvlink", FAIL, "nvidia-smi topo -m did not run"))
        else:
            try:
                checks.append(check_nvlink(parse_topo_matrix(out), c.gpus_per_node))
            except ValueError as e:
                checks.append(Check("nvlink", FAIL, str(e)))
    else:
        checks.append(Check("nvlink", SKIP, f"intra_node_link={c.intra_node_link}, device={device}"))
    if c.fabric in ("ib_hdr", "ib_ndr", "roce_v2") and c.fabric_adapters_per_node > 0:
        out = _run(["ibstat"])
        if out is not None:
            checks.append(check_ib(parse_ibstat(out), cfg, "ibstat"))
        elif (out := _run(["ibdev2netdev", "-v"])) is not None:
            checks.append(check_ib(parse_ibdev2netdev(out), cfg, "ibdev2netdev -v"))
        else:
            checks.append(Check("infiniband", FAIL, "neither ibstat nor ibdev2netdev is installed"))
    else:
        checks.append(Check("infiniband", SKIP, f"fabric={c.fabric}"))
    checks.append(check_space(cfg, params, c.nodes, checkpoint_dir))
    checks.append(check_ram(cfg, *meminfo_gb(), slurm_memory()))
    checks.append(check_s3(cfg))
    return checks
