"""Calibration parameters of the performance model. Their only values live
in ``conf/perf/default.yaml`` (or a file given with ``--perf``), read once;
:mod:`launcher.perf.calibrate` refits them. The dataclass is the schema: no field
has a default, so a file that misses a key is refused by name."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from launcher.config.validate import ConfigError

DEFAULT_PATH = Path(__file__).resolve().parents[2] / "conf" / "perf" / "default.yaml"


@dataclass
class GpuParams:
    hbm_gb_per_s: float
    matmul_efficiency: float
    attention_efficiency: float
    # CUDA context + NCCL buffers (GB per GPU), before fragmentation.
    hbm_reserve_gb: float


@dataclass
class PerfParams:
    gpus: dict[str, GpuParams]
    hbm_efficiency: float
    hbm_fragmentation: float
    elementwise_bytes_per_dim: float
    elementwise_bytes_per_kv: float
    elementwise_bytes_per_ffn: float
    loss_bytes_per_vocab: float
    compile_elementwise_factor: float
    optimizer_bytes_per_param: float
    float8_peak_ratio: float  # FP8 / bf16 dense peak
    float8_cast_share: dict[str, float]  # per recipe: casts, as a share of the bf16 GEMM time
    block_overhead_s: float
    step_overhead_s: float
    overlap_slowdown: float
    nvlink_efficiency: float
    nvlink_latency_us: float
    pcie_efficiency: float
    pcie_latency_us: float
    fabric_efficiency: dict[str, float]
    fabric_latency_us: float
    pp_p2p_overlap: float
    zero_bubble_fill: float
    # CPU ranks: the peak comes from a matmul probe of the host
    # (launcher/perf/cpu_peak.py) unless cpu_peak_gflops_per_core is set (> 0).
    cpu_peak_gflops_per_core: float
    cpu_peak_bf16_gflops_per_core: float
    cpu_matmul_efficiency: float  # fp32 plans
    cpu_bf16_matmul_efficiency: float  # bf16 plans, against the bf16 peak
    cpu_mem_gb_per_s_per_rank: float
    cpu_link_gb_per_s: float
    cpu_link_latency_us: float
    cpu_block_overhead_s: float
    cpu_step_overhead_s: float
    gpu_decode_images_per_s: float
    cpu_decode_images_per_s_per_core: float
    token_read_gb_per_s_per_node: float
    checkpoint_stage_gb_per_s: float
    checkpoint_stage_fixed_s: float
    nvme_write_gb_per_s_per_node: float
    shared_fs_write_gb_per_s_per_node: float
    base_uncertainty_pct: float
    # Where the fitted constants came from, per device kind ("gpu", "cpu").
    provenance: dict[str, str]
    # The file these values were read from (not a key of the file).
    source: str = dataclasses.field(default="", metadata={"file_key": False})

    def gpu(self, gpu_type: str) -> GpuParams:
        """The entry whose key is the longest substring of ``gpu_type``."""
        name = gpu_type.upper()
        keys = sorted((k for k in self.gpus if k != "default" and k.upper() in name), key=len, reverse=True)
        key = keys[0] if keys else "default"
        if key not in self.gpus:
            raise ConfigError(f"perf params: no entry for gpu_type={gpu_type!r} and no 'default' entry")
        return self.gpus[key]

    def fabric_eff(self, fabric: str) -> float:
        if fabric not in self.fabric_efficiency:
            raise ConfigError(
                f"perf params: fabric_efficiency has no entry for cluster.fabric={fabric!r}; "
                f"entries: {sorted(self.fabric_efficiency)}"
            )
        return self.fabric_efficiency[fabric]

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("source")
        return d

    def replace(self, **changes: Any) -> PerfParams:
        return dataclasses.replace(self, **changes)


FILE_KEYS = [f.name for f in dataclasses.fields(PerfParams) if f.metadata.get("file_key", True)]


def params_from_dict(d: dict[str, Any], source: str = "") -> PerfParams:
    unknown = sorted(set(d) - set(FILE_KEYS))
    missing = [k for k in FILE_KEYS if k not in d]
    if unknown or missing:
        raise ConfigError(
            f"perf params {source or ''}: "
            + "; ".join(
                part
                for part in (
                    f"unknown key(s) {unknown}" if unknown else "",
                    f"missing key(s) {missing}" if missing else "",
                )
                if part
            )
            + f" (valid keys: {FILE_KEYS})"
        )
    d = dict(d)
    gpus = {}
    for name, g in (d.pop("gpus") or {}).items():
        try:
            gpus[name] = GpuParams(**g)
        except TypeError as e:
            raise ConfigError(f"perf params: gpus.{name}={g!r} is invalid: {e}") from e
    return PerfParams(gpus=gpus, source=source, **d)


@functools.lru_cache(maxsize=8)
def _load(path: Path) -> PerfParams:
    with open(path) as f:
        data = yaml.safe_load(f) or {}
    return params_from_dict(data, source=str(path))


def load_params(path: str | Path | None = None) -> PerfParams:
    """The calibration file (default: conf/perf/default.yaml), read once per
    process; callers that change values take a copy (``replace``)."""
    path = Path(path).resolve() if path else DEFAULT_PATH
    if not path.is_file():
        raise ConfigError(f"perf params file {str(path)!r} does not exist")
    return _load(path)


def save_params(p: PerfParams, path: str | Path) -> None:
    with open(path, "w") as f:
        yaml.safe_dump(p.to_dict(), f, sort_keys=False)


def _yaml_number(v: float) -> str:
    return f"{v:.4g}"


def update_file(path: str | Path, p: PerfParams, names: list[str]) -> None:
    """Write the values of ``names`` (dotted, ``|``-tied as in the fit) and
    the provenance of ``p`` into the calibration file in place, keeping its
    comments and layout (the file stays the one source of the values)."""
    import json
    import re

    path = Path(path)
    text = path.read_text()
    for tied in names:
        for name in tied.split("|"):
            parts = name.split(".")
            if parts[0] == "gpus" and len(parts) == 3:
                value = getattr(p.gpus[parts[1]], parts[2])
                pat = re.compile(rf"^(\s+{re.escape(parts[1])}:\s*\{{.*?\b{parts[2]}:\s*)([-0-9.eE+]+)", re.M)
            elif len(parts) == 1:
                value = getattr(p, name)
                pat = re.compile(rf"^({re.escape(name)}:\s*)([-0-9.eE+]+)", re.M)
            else:
                raise ValueError(f"cannot write {name!r} into {path}")
            text, n = pat.subn(lambda m, v=value: m.group(1) + _yaml_number(v), text, count=1)
            if n != 1:
                raise ValueError(f"{path}: no line for {name!r}")
    for kind, where in p.provenance.items():
        text, n = re.subn(
            rf'^(\s+{kind}:\s*)".*"$',
            lambda m, w=where: m.group(1) + json.dumps(w),
            text,
            count=1,
            flags=re.M,
        )
        if n != 1:
            raise ValueError(f"{path}: no provenance line for {kind!r}")
    path.write_text(text)
    _load.cache_clear()
