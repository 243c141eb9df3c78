"""Float8 training of the block linears (train.float8, docs/speed.md) with
torchao.float8, the way torchtitan applies it: converted on the meta model
before TP, AC, compile and FSDP (parallelize.py), so each later step wraps
Float8Linear modules; with FSDP2 and the tensorwise recipe the weights are
all-gathered in float8 and their scales precomputed once after each
optimizer step (:func:`precompute_scales`).

torchao is imported here only (the ``meshrun[float8]`` extra)."""

from __future__ import annotations

import torch
from torch import nn

from launcher.config.validate import ConfigError

# torch._scaled_mm needs both GEMM dimensions of a weight in multiples of 16.
FLOAT8_MULTIPLE = 16
# The output head stays in high precision (torchtitan: "output" in its
# filter_fqns): its logits feed the loss directly, and float8 there hurts
# convergence for little speed.
SKIPPED_NAMES = ("output",)
INSTALL_HINT = "pip install 'meshrun[float8]' (torchao)"


def qualifies(module: nn.Module, fqn: str) -> bool:
    """The module_filter_fn: a Linear, not the output head, in and out
    features multiples of 16."""
    if not isinstance(module, nn.Linear) or fqn.rsplit(".", 1)[-1] in SKIPPED_NAMES:
        return False
    return module.in_features % FLOAT8_MULTIPLE == 0 and module.out_features % FLOAT8_MULTIPLE == 0


def _import_torchao():
    try:
        import torchao.float8 as f8
    except ImportError as e:
        raise ConfigError(
            f"train.float8 needs torchao, which this Python cannot import ({e}): {INSTALL_HINT}, "
            "or set train.float8=off"
        ) from e
    return f8


def check_device(device: torch.device) -> bool:
    """Whether the GEMMs are emulated (CPU ranks). On CUDA, a GPU without
    FP8 tensor cores (compute capability < 8.9) is refused: the launcher
    refuses the GPU types it knows; this catches the rest."""
    if device.type != "cuda":
        return True
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        raise ConfigError(
            f"train.float8 needs FP8 tensor cores (compute capability >= 8.9: H100, H200, B200, L40S, ...); "
            f"{torch.cuda.get_device_name(device)} is {major}.{minor}: set train.float8=off"
        )
    return False


def float8_config(recipe: str, *, fsdp: bool, emulate: bool):
    """torchao's Float8LinearConfig for ``recipe``: tensorwise all-gathers
    FSDP2's weights in float8 (torchtitan's default); rowwise cannot."""
    import dataclasses

    f8 = _import_torchao()
    base = f8.Float8LinearConfig.from_recipe_name(recipe)
    return dataclasses.replace(
        base, emulate=emulate, enable_fsdp_float8_all_gather=fsdp and recipe == "tensorwise"
    )


def apply_float8(model: nn.Module, recipe: str, *, fsdp: bool, device: torch.device) -> list[str]:
    """Swap the qualifying linears for Float8Linear; returns their names.
    Refuses a model with none (the launcher checks the shape first)."""
    if recipe == "off":
        return []
    emulate = check_device(device)
    f8 = _import_torchao()
    converted = [name for name, mod in model.named_modules() if qualifies(mod, name)]
    if not converted:
        raise ConfigError(
            f"train.float8={recipe}: no linear layer qualifies (in and out features multiples of "
            f"{FLOAT8_MULTIPLE}, the output layer skipped); set train.float8=off"
        )
    f8.convert_to_float8_training(
        model, module_filter_fn=qualifies, config=float8_config(recipe, fsdp=fsdp, emulate=emulate)
    )
    return converted


def describe(parts: list[nn.Module], recipe: str, device: torch.device) -> str:
    """The run log's line (printed once, by rank 0): what was converted, how."""
    n = sum(type(m).__name__ == "Float8Linear" for part in parts for m in part.modules())
    how = (
        "emulated on CPU (torchao emulate=True: float8 rounding, high-precision GEMMs, no speedup)"
        if device.type != "cuda"
        else "on FP8 tensor cores"
    )
    return f"float8 {recipe}: {n} linears converted (output layer and non-multiple-of-16 shapes kept), {how}"


def float8_tp_styles(model: nn.Module) -> tuple | None:
    """(PrepareModuleInput, ColwiseParallel, RowwiseParallel) of torchao's
    float8 tensor parallel, for the tensorwise recipe's blocks; None when a
    block linear stayed high precision (the float8 styles cast every input
    of the module they prepare)."""
    layers = getattr(model, "layers", {})
    linears = [m for block in layers.values() for m in block.modules() if isinstance(m, nn.Linear)]
    if not linears or any(type(m).__name__ != "Float8Linear" for m in linears):
        return None
    _import_torchao()
    from torchao.float8.float8_tensor_parallel import (
        Float8ColwiseParallel,
        Float8RowwiseParallel,
        PrepareFloat8ModuleInput,
    )

    return PrepareFloat8ModuleInput, Float8ColwiseParallel, Float8RowwiseParallel


def precompute_scales(parts: list[nn.Module]) -> None:
    """After the optimizer step: the float8 scales of every FSDP2 weight in
    one all-reduce, so the next forward's all-gather sends float8 (torchao's
    precompute_float8_dynamic_scale_for_fsdp; a no-op without FSDP)."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    for part in parts:
        precompute_float8_dynamic_scale_for_fsdp(part)
