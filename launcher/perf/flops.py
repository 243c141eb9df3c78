"""Parameter counts and FLOPs per token from a model shape (pure Python).

Shared by the planner (memory, cost), the performance model and the trainer's
MFU so that every figure uses the same arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.config.schema import ModelConfig


@dataclass(frozen=True)
class ParamCounts:
    embedding: int  # token embedding (or ViT patch embedding + positions)
    per_layer: int  # one transformer block
    n_layers: int
    output: int  # final norm + output projection (LM head / classifier)

    @property
    def total(self) -> int:
        return self.embedding + self.per_layer * self.n_layers + self.output


def head_dim(m: ModelConfig) -> int:
    return m.dim // m.n_heads


def param_counts(m: ModelConfig) -> ParamCounts:
    hd = head_dim(m)
    if m.family == "vit":
        n_patches = (m.image_size // m.patch_size) ** 2
        embedding = 3 * m.patch_size**2 * m.dim + m.dim + (n_patches + 1) * m.dim
        # qkv + proj (with biases), 2-layer GELU MLP (with biases), 2 LayerNorms.
        per_layer = 4 * m.dim * m.dim + 4 * m.dim + 2 * m.dim * m.ffn_dim + m.ffn_dim + m.dim + 4 * m.dim
        output = 2 * m.dim + m.dim * m.num_classes + m.num_classes
        return ParamCounts(embedding, per_layer, m.n_layers, output)
    attn = m.dim * (m.n_heads * hd) + 2 * m.dim * (m.n_kv_heads * hd) + (m.n_heads * hd) * m.dim
    mlp = 3 * m.dim * m.ffn_dim  # SwiGLU: w1, w3 up; w2 down
    per_layer = attn + mlp + 2 * m.dim  # + two RMSNorm weights
    return ParamCounts(m.vocab_size * m.dim, per_layer, m.n_layers, m.dim + m.dim * m.vocab_size)


def tokens_per_sample(m: ModelConfig) -> int:
    """Sequence positions one sample feeds through the blocks."""
    if m.family == "vit":
        return (m.image_size // m.patch_size) ** 2 + 1
    return m.seq_len


def flops_per_token(m: ModelConfig) -> float:
    """Model FLOPs per token for forward + backward (no recompute).

    torchtitan's convention, so MFU figures compare: 6 x (parameters without
    the embedding lookup) + 12 x layers x heads x head_dim x seq_len for the
    attention score and value products.
    """
    pc = param_counts(m)
    dense = pc.total - pc.embedding
    attention = 12 * m.n_layers * m.n_heads * head_dim(m) * tokens_per_sample(m)
    return 6.0 * dense + attention


def recompute_flops_per_token(m: ModelConfig, activation_checkpointing: str) -> float:
    """Extra FLOPs per token spent recomputing activations in backward."""
    if activation_checkpointing == "full":
        return flops_per_token(m) / 3.0  # one more forward of every block
    if activation_checkpointing == "selective":
        # Op-level SAC keeps matmul outputs and recomputes cheap elementwise
        # ops: a few percent of a forward.
        return flops_per_token(m) / 3.0 * 0.05
    return 0.0
