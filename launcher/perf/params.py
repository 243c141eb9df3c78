"""Calibration parameters of the performance model, kept in YAML
(``conf/perf/default.yaml``) and refitted by :mod:`launcher.perf.fit`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from launcher.validate import ConfigError

DEFAULT_PATH = Path(__file__).resolve().parents[2] / "conf" / "perf" / "default.yaml"


@dataclass
class GpuParams:
    hbm_gb_per_s: float
    matmul_efficiency: float
    attention_efficiency: float


@dataclass
class PerfParams:
    gpus: dict[str, GpuParams] = field(default_factory=dict)
    hbm_efficiency: float = 0.8
    elementwise_bytes_per_dim: float = 340.0
    elementwise_bytes_per_kv: float = 106.0
    elementwise_bytes_per_ffn: float = 35.0
    loss_bytes_per_vocab: float = 40.0
    compile_elementwise_factor: float = 0.35
    optimizer_bytes_per_param: float = 28.0
    float8_matmul_speedup: float = 1.5
    block_overhead_s: float = 0.003
    step_overhead_s: float = 0.02
    overlap_slowdown: float = 0.10
    nvlink_efficiency: float = 0.80
    nvlink_latency_us: float = 8.0
    pcie_efficiency: float = 0.70
    pcie_latency_us: float = 15.0
    fabric_efficiency: dict[str, float] = field(default_factory=dict)
    fabric_latency_us: float = 20.0
    pp_p2p_overlap: float = 0.5
    zero_bubble_fill: float = 0.67
    cpu_gflops_per_rank: float = 20.0
    cpu_mem_gb_per_s_per_rank: float = 5.0
    cpu_link_gb_per_s: float = 1.0
    cpu_link_latency_us: float = 60.0
    gpu_decode_images_per_s: float = 2500.0
    cpu_decode_images_per_s_per_core: float = 150.0
    token_read_gb_per_s_per_node: float = 2.0
    checkpoint_stage_gb_per_s: float = 10.0
    checkpoint_stage_fixed_s: float = 0.3
    nvme_write_gb_per_s_per_node: float = 5.0
    shared_fs_write_gb_per_s_per_node: float = 2.0
    base_uncertainty_pct: float = 15.0
    # Where these values came from (a file path, or "fit: <runs>").
    source: str = ""

    def gpu(self, gpu_type: str) -> GpuParams:
        """The entry whose key is the longest substring of ``gpu_type``."""
        name = gpu_type.upper()
        keys = sorted((k for k in self.gpus if k != "default" and k.upper() in name), key=len, reverse=True)
        key = keys[0] if keys else "default"
        if key not in self.gpus:
            raise ConfigError(f"perf params: no entry for gpu_type={gpu_type!r} and no 'default' entry")
        return self.gpus[key]

    def fabric_eff(self, fabric: str) -> float:
        return self.fabric_efficiency.get(fabric, 0.7)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> PerfParams:
        return dataclasses.replace(self, **changes)


def params_from_dict(d: dict[str, Any], source: str = "") -> PerfParams:
    known = {f.name for f in dataclasses.fields(PerfParams)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ConfigError(f"perf params: unknown key(s) {unknown}; valid keys: {sorted(known)}")
    d = dict(d)
    gpus = {}
    for name, g in (d.pop("gpus", None) or {}).items():
        try:
            gpus[name] = GpuParams(**g)
        except TypeError as e:
            raise ConfigError(f"perf params: gpus.{name}={g!r} is invalid: {e}") from e
    p = PerfParams(gpus=gpus, **d)
    if not p.source:
        p.source = source
    return p


def load_params(path: str | Path | None = None) -> PerfParams:
    """Read a calibration file (default: conf/perf/default.yaml)."""
    path = Path(path) if path else DEFAULT_PATH
    if not path.is_file():
        raise ConfigError(f"perf params file {str(path)!r} does not exist")
    with open(path) as f:
        data = yaml.safe_load(f) or {}
    return params_from_dict(data, source=str(path))


def save_params(p: PerfParams, path: str | Path) -> None:
    with open(path, "w") as f:
        yaml.safe_dump(p.to_dict(), f, sort_keys=False)
