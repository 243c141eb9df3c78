"""Apply the Plan's parallelism to a (meta-device) model, in torchtitan's
order, which is the only order where each step sees what it expects:

0. float8 (train.float8, float8.py): swaps nn.Linear for torchao's
   Float8Linear on the meta model; first, so TP shards, AC wraps, compile
   traces and FSDP2 shards (and all-gathers in float8) the float8 modules.
1. tensor parallel (+ sequence parallel): rewrites Linear/Embedding params
   into DTensors on the "tp" mesh; must come first so later wrappers wrap the
   already-sharded modules.
2. activation checkpointing: wraps each block (full) or each block's ops
   (selective); after TP so recompute replays the TP collectives.
3. torch.compile per block: after TP/AC so graphs include them; per block
   because whole-model compile after TP fails ("Mixing fake modes").
4. FSDP2 fully_shard per block, then the root: last, so it shards the
   TP-sharded DTensors over the data-parallel mesh (2-D mesh = HSDP; with
   context parallel, over dp_shard x cp).
5. context parallel is no module rewrite: torch's context_parallel is a
   context around each micro-batch's forward and backward over the
   sequence-sharded buffers (cp.py, opened in train/loop/step.py).
"""

from __future__ import annotations

import os

import torch
from torch import nn

from train.models.llama import Llama


def apply_tp(model: Llama, tp_mesh, float8_tensorwise: bool = False) -> None:
    """Megatron-style TP with sequence parallel: norms and residuals run on
    sequence shards; attention/FFN inputs are all-gathered, outputs
    reduce-scattered back to sequence shards. Under float8 tensorwise on
    GPUs the blocks use torchao's float8 TP styles (torchtitan's choice):
    inputs are cast before the all-gather, which then moves float8 (gloo has
    no float8 dtypes: "Invalid scalar type"; CPU ranks keep the plain
    styles, whose tensorwise scales are the same: amax over the whole
    tensor either way)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    top: dict = {}
    if model.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
    if model.norm is not None:
        top["norm"] = SequenceParallel()
    if model.output is not None:
        # Replicated logits keep the loss a plain cross-entropy on every rank.
        top["output"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())
    if top:
        parallelize_module(model, tp_mesh, top)
    prepare, colwise, rowwise = PrepareModuleInput, ColwiseParallel, RowwiseParallel
    if float8_tensorwise:
        from train.parallel.float8 import float8_tp_styles

        prepare, colwise, rowwise = float8_tp_styles(model) or (prepare, colwise, rowwise)
    for block in model.layers.values():
        parallelize_module(
            block,
            tp_mesh,
            {
                "attention_norm": SequenceParallel(),
                "attention": prepare(
                    input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)
                ),
                "attention.wq": colwise(),
                "attention.wk": colwise(),
                "attention.wv": colwise(),
                "attention.wo": rowwise(output_layouts=Shard(1)),
                "ffn_norm": SequenceParallel(),
                "feed_forward": prepare(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                "feed_forward.w1": colwise(),
                "feed_forward.w2": rowwise(output_layouts=Shard(1)),
                "feed_forward.w3": colwise(),
            },
        )


# Ops whose outputs selective AC keeps (the expensive ones); everything else
# (norms, activations, RoPE, elementwise) is recomputed in backward.
def _sac_save_ops() -> set:
    ops = torch.ops.aten
    names = [
        "mm",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
    ]
    save = {getattr(ops, n).default for n in names if hasattr(ops, n)}
    # Keep TP reduce-scatter results: recomputing them costs communication.
    if hasattr(torch.ops, "_c10d_functional"):
        save.add(torch.ops._c10d_functional.reduce_scatter_tensor.default)
    return save


def apply_ac(model: Llama, mode: str) -> None:
    if mode == "none":
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    if mode == "full":
        for key, block in model.layers.items():
            model.layers[key] = checkpoint_wrapper(block, preserve_rng_state=False)
        return
    assert mode == "selective", mode
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    save = _sac_save_ops()

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE

    def context_fn():
        return create_selective_checkpoint_contexts(policy)

    for key, block in model.layers.items():
        model.layers[key] = checkpoint_wrapper(block, context_fn=context_fn, preserve_rng_state=False)


def _per_rank_compile_cache() -> None:
    """Inductor's on-disk caches are shared by a node's ranks by default, and
    a cached graph carries the process-group names of the rank that compiled
    it: a rank of another TP group then fails with "Could not resolve the
    process group" (seen with dp2 x tp2). One cache directory per rank."""
    import getpass
    import tempfile

    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else 0
    base = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(
        tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}"
    )
    if not base.endswith(f"rank{rank}"):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(base, f"rank{rank}")


def apply_compile(model: Llama, tp: bool) -> None:
    """Compile each block separately: identical blocks share one graph, and
    FSDP's per-block hooks stay outside the compiled region.

    With tensor parallel, compile the attention and feed-forward inside each
    block and leave the sequence-parallel RMSNorms eager: compiled, their
    weight gradients missed the reduction across TP ranks (torch 2.13:
    dp2_tp2_compiled's grad norm off by 2e-3 at step 1, TP-only compiled
    failed in backward); eager norms match to 5e-7 (scripts/verify_parallel.py).
    """
    _per_rank_compile_cache()
    for key, block in model.layers.items():
        if not tp:
            model.layers[key] = torch.compile(block, fullgraph=True)
            continue
        inner = getattr(block, "_checkpoint_wrapped_module", block)  # under AC
        inner.attention = torch.compile(inner.attention, fullgraph=True)
        inner.feed_forward = torch.compile(inner.feed_forward, fullgraph=True)


def apply_fsdp(model: Llama, dp_mesh, precision: str, reshard_after_forward: bool = True) -> None:
    """FSDP2 per block then the root. bf16: params/compute in bf16, gradient
    reduction in fp32 (the master weights and optimizer stay fp32)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if precision == "bf16":
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    else:
        mp = MixedPrecisionPolicy()
    kw = {"mesh": dp_mesh, "mp_policy": mp}
    if model.tok_embeddings is not None:
        fully_shard(model.tok_embeddings, reshard_after_forward=reshard_after_forward, **kw)
    blocks = list(model.layers.values())
    for i, block in enumerate(blocks):
        # The last block's params are needed again at once by backward.
        fully_shard(block, reshard_after_forward=reshard_after_forward and i < len(blocks) - 1, **kw)
    if model.norm is not None and model.output is not None:
        fully_shard([model.norm, model.output], reshard_after_forward=False, **kw)
    fully_shard(model, reshard_after_forward=reshard_after_forward, **kw)


def parallelize(
    model: Llama, mesh, dims, plan, *, reshard_after_forward: bool = True, float8: str = "off"
) -> bool:
    """Apply float8 -> TP -> AC -> compile -> FSDP. Returns whether FSDP was applied."""
    from train.parallel.mesh import dp_mesh_for_fsdp

    dp_mesh = dp_mesh_for_fsdp(mesh, dims, plan.precision)
    if float8 != "off":
        from train.parallel.float8 import apply_float8

        apply_float8(model, float8, fsdp=dp_mesh is not None, device=torch.device(mesh.device_type))
    if dims.tp > 1:
        apply_tp(model, mesh["tp"], float8_tensorwise=float8 == "tensorwise" and mesh.device_type == "cuda")
    apply_ac(model, plan.activation_checkpointing)
    if plan.compile:
        apply_compile(model, tp=dims.tp > 1)
    if dp_mesh is not None:
        apply_fsdp(model, dp_mesh, plan.precision, reshard_after_forward)
    return dp_mesh is not None


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
