"""Float8 GEMMs (train.float8) in the performance model: the block matmuls'
time in float8 over bf16, from conf/perf/default.yaml (torchtitan's Llama
3.1 8B runs on 8 H100; docs/speed.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launcher.config.schema import RunConfig
    from launcher.perf.params import PerfParams


def float8_recipe(cfg: RunConfig, float8: bool | str | None) -> str:
    if float8 is None:
        return cfg.train.float8
    if isinstance(float8, bool):
        return "tensorwise" if float8 else "off"
    return float8


def float8_matmul_factor(p: PerfParams, recipe: str, cpu: bool) -> float:
    """A block GEMM's time in float8 over its bf16 time: the FP8 peak's
    share plus the casts (conf/perf/default.yaml, from torchtitan's 8B
    runs). 1 when off, and on CPU ranks, which emulate float8."""
    if recipe == "off" or cpu:
        return 1.0
    return 1 / p.float8_peak_ratio + p.float8_cast_share[recipe]


def float8_note(p: PerfParams, recipe: str, cpu: bool) -> str:
    if cpu:
        return f"float8 {recipe}: emulated on CPU ranks (no FP8 units), no speedup modelled"
    f = float8_matmul_factor(p, recipe, cpu)
    return (
        f"float8 {recipe}: block GEMMs at {f:.2f}x their bf16 time (FP8 peak {p.float8_peak_ratio:g}x bf16, "
        f"casts {p.float8_cast_share[recipe]:.0%} of the bf16 GEMM time; conf/perf/default.yaml, "
        "from torchtitan's Llama 3.1 8B on 8 H100); the output head stays bf16"
    )
