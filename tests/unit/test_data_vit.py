"""The ViT of data=images: parameter count agrees with the planner's
arithmetic, logits keep a length-1 position axis, FSDP-style meta build."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from launcher.config.compose import compose
from launcher.perf.flops import param_counts
from train.models.llama import build_meta_model
from train.models.vit import ViT


@pytest.mark.parametrize("name", ["vit_tiny", "vit_b16"])
def test_param_count_matches_planner(name):
    m = compose([f"model={name}", "data=images", "data.path=x"]).model
    model = build_meta_model(m)  # the trainer's factory dispatches on family
    assert isinstance(model, ViT) and model.tok_embeddings is None
    assert sum(p.numel() for p in model.parameters()) == param_counts(m).total
    assert m.seq_len == (m.image_size // m.patch_size) ** 2 + 1


def test_forward_shape_and_loss():
    m = compose(["model=vit_tiny", "data=images", "data.path=x", "model.image_size=32"]).model
    torch.manual_seed(0)
    model = ViT(m)
    images, labels = torch.randn(3, 3, 32, 32), torch.tensor([[1], [2], [3]])
    logits = model(images)
    assert logits.shape == (3, 1, m.num_classes) and logits.dtype == torch.float32
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(0, 1))
    loss.backward()
    assert model.patch_embed.proj.weight.grad.abs().sum() > 0
    # fp16 batches (DALI on GPUs) are cast to the parameter dtype.
    assert torch.allclose(model(images.half()), model(images.half().float()), atol=1e-5)
