"""train.float8 checked before anything is written: the GPU type has FP8
tensor cores, the model has a linear the float8 filter converts, torchao is
installed for the Python that runs the ranks. The trainer's side (and the
filter these shapes mirror) is train/parallel/float8.py."""

from __future__ import annotations

import importlib.util

from launcher.config.schema import ModelConfig, RunConfig
from launcher.config.validate import fail
from launcher.plan.candidates import ranks_per_node

FLOAT8_MULTIPLE = 16  # torch._scaled_mm: both dimensions of a weight
INSTALL_HINT = "pip install 'meshrun[float8]' (torchao)"
# GPU families without FP8 tensor cores (compute capability < 8.9), matched
# as a prefix of cluster.gpu_type (lower case, "nvidia" dropped). Types not
# listed pass here; the trainer checks the device's capability at start.
NO_FP8 = ("a100", "a800", "a40", "a30", "a10", "a16", "a2", "a6000", "a5000", "v100", "t4", "p100", "p40")
NO_FP8 += ("rtx3090", "rtx3080", "rtxa6000", "mi250", "mi210", "mi100")


def block_linears(m: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in, out) features of each linear in a block, and the ViT's patch
    projection; the output head is never converted, so not listed."""
    if m.family == "vit":
        return {
            "proj": (3 * m.patch_size**2, m.dim),
            "attention.wqkv": (m.dim, 3 * m.dim),
            "attention.wo": (m.dim, m.dim),
            "feed_forward.w1": (m.dim, m.ffn_dim),
            "feed_forward.w2": (m.ffn_dim, m.dim),
        }
    hd = m.dim // m.n_heads
    return {
        "attention.wq": (m.dim, m.n_heads * hd),
        "attention.wk": (m.dim, m.n_kv_heads * hd),
        "attention.wv": (m.dim, m.n_kv_heads * hd),
        "attention.wo": (m.n_heads * hd, m.dim),
        "feed_forward.w1": (m.dim, m.ffn_dim),
        "feed_forward.w2": (m.ffn_dim, m.dim),
        "feed_forward.w3": (m.dim, m.ffn_dim),
    }


def converted_linears(m: ModelConfig) -> list[str]:
    return [
        name
        for name, (i, o) in block_linears(m).items()
        if i % FLOAT8_MULTIPLE == 0 and o % FLOAT8_MULTIPLE == 0
    ]


def has_fp8(gpu_type: str) -> bool:
    t = gpu_type.lower().replace("nvidia", "").replace(" ", "").lstrip("-_")
    return not t.startswith(NO_FP8)


def check_float8(cfg: RunConfig) -> None:
    recipe = cfg.train.float8
    if recipe == "off":
        return
    _, device = ranks_per_node(cfg)
    if device == "cuda" and not has_fp8(cfg.cluster.gpu_type):
        raise fail(
            "train.float8",
            recipe,
            f"needs FP8 tensor cores (H100/H200/B200/L40S..., compute capability >= 8.9); "
            f"cluster.gpu_type={cfg.cluster.gpu_type} has none: set train.float8=off "
            "or use a cluster with them",
        )
    m = cfg.model
    if not converted_linears(m):
        shapes = ", ".join(f"{n} {i}x{o}" for n, (i, o) in block_linears(m).items())
        raise fail(
            "train.float8",
            recipe,
            f"no linear layer of model={m.name} qualifies (in and out features must be multiples "
            f"of {FLOAT8_MULTIPLE}; the output layer is kept in high precision): {shapes}; "
            "set train.float8=off",
        )
    # Ranks run this Python unless a container image brings its own.
    if not cfg.cluster.container_image and importlib.util.find_spec("torchao") is None:
        raise fail("train.float8", recipe, f"torchao is not installed for this Python: {INSTALL_HINT}")
