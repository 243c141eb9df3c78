"""Hugging Face Llama weights in and out of meshrun's model.

In: :func:`load_hf_weights` fills a (possibly FSDP / TP sharded, possibly
pipeline-split) model from a directory as ``save_pretrained`` writes it
(``config.json`` + ``model.safetensors`` or ``model-*.safetensors`` with
``model.safetensors.index.json``). Each rank reads only the rows/columns its
shard holds (safetensors slices); the rare placement that is not one box of
the full tensor (FSDP on top of TP along the same dim) reads the parameter
whole and keeps its shard.

Out: :func:`export_live` (every rank of a running job; each pipeline rank
writes its own safetensors file); a finished run's checkpoint is exported by
:mod:`train.jobs.export` (``python -m train.jobs.export RUN_DIR OUT``).

RoPE layout: meshrun rotates interleaved pairs (2i, 2i+1) of each head
(Meta's layout); Hugging Face rotates (i, i + head_dim/2) ("rotate_half"),
so its q/k projection rows are a per-head permutation of Meta's (the one
transformers' convert_llama_weights_to_hf.py applies). :func:`to_hf` /
:func:`_from_hf_rows` apply it and its inverse.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from torch import nn

from launcher.config.schema import ModelConfig

SAFE_INDEX = "model.safetensors.index.json"
SAFE_SINGLE = "model.safetensors"
# Files besides the weights that make an exported dir usable on its own.
SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")

# Bytes of weights this process read in its last load_job_weights (tests
# check that a sharded rank reads only its share).

_BLOCK = {
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
_TOP = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def canonical_name(name: str) -> str:
    for part in ("_checkpoint_wrapped_module.", "_orig_mod."):
        name = name.replace(part, "")
    return name


def hf_key(name: str) -> str:
    """meshrun parameter name -> Hugging Face state-dict key."""
    if name in _TOP:
        return _TOP[name]
    parts = name.split(".", 2)
    if parts[0] == "layers" and len(parts) == 3 and parts[2] in _BLOCK:
        return f"model.layers.{parts[1]}.{_BLOCK[parts[2]]}"
    raise KeyError(f"no Hugging Face name for meshrun parameter {name!r}")


def _rope_heads(name: str, m: ModelConfig) -> int:
    """Heads whose rows are RoPE-permuted (0: not a q/k projection)."""
    if name.endswith("attention.wq.weight"):
        return m.n_heads
    if name.endswith("attention.wk.weight"):
        return m.n_kv_heads
    return 0


def to_hf(name: str, t: torch.Tensor, m: ModelConfig) -> torch.Tensor:
    """A full meshrun tensor in Hugging Face's layout (q/k rows permuted)."""
    heads = _rope_heads(name, m)
    if not heads:
        return t
    hd = m.dim // m.n_heads
    return t.reshape(heads, hd // 2, 2, -1).transpose(1, 2).reshape(heads * hd, -1)


def _from_hf_rows(t: torch.Tensor, hd: int) -> torch.Tensor:
    """Whole heads of HF q/k rows -> meshrun's interleaved layout."""
    n = t.shape[0] // hd
    return t.reshape(n, 2, hd // 2, -1).transpose(1, 2).reshape(n * hd, -1)


class HFReader:
    """Lazy reader of a Hugging Face safetensors directory."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        index = self.path / SAFE_INDEX
        if index.is_file():
            self.weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        elif (self.path / SAFE_SINGLE).is_file():
            from safetensors import safe_open

            with safe_open(str(self.path / SAFE_SINGLE), framework="pt") as f:
                self.weight_map = dict.fromkeys(f.keys(), SAFE_SINGLE)
        else:
            raise FileNotFoundError(
                f"job.hf_path={str(path)!r}: neither {SAFE_INDEX} nor {SAFE_SINGLE} in it "
                "(meshrun reads safetensors weights only)"
            )
        self._files: dict[str, object] = {}
        self.bytes_read = 0

    def __contains__(self, key: str) -> bool:
        return key in self.weight_map

    def _slice(self, key: str):
        from safetensors import safe_open

        fname = self.weight_map[key]
        if fname not in self._files:
            self._files[fname] = safe_open(str(self.path / fname), framework="pt")
        return self._files[fname].get_slice(key)

    def shape(self, key: str) -> list[int]:
        return list(self._slice(key).get_shape())

    def read(self, key: str, box: tuple[tuple[int, int], ...] | None = None) -> torch.Tensor:
        """The tensor, or only ``box`` ((start, stop) per dim) of it."""
        sl = self._slice(key)
        if box is None:
            box = tuple((0, n) for n in sl.get_shape())
        t = sl[tuple(slice(a, b) for a, b in box)]
        self.bytes_read += t.numel() * t.element_size()
        return t


def _key_for(name: str, reader: HFReader) -> str:
    key = hf_key(name)
    # tie_word_embeddings: no lm_head in the files, the embedding is the output.
    if key == "lm_head.weight" and key not in reader:
        key = "model.embed_tokens.weight"
    if key not in reader:
        raise KeyError(f"job.hf_path={str(reader.path)!r}: tensor {key!r} (for {name}) is missing")
    return key


def read_box(name: str, reader: HFReader, m: ModelConfig, box: tuple[tuple[int, int], ...]) -> torch.Tensor:
    """Rows/cols ``box`` of meshrun parameter ``name``, read from the HF files.
    q/k rows come from whole heads (the RoPE permutation stays inside one)."""
    key = _key_for(name, reader)
    expected = _expected_shape(name, m)
    got = reader.shape(key)
    if got != expected:
        raise ValueError(
            f"job.hf_path: {key} has shape {got}, meshrun's {name} needs {expected} "
            "(config.json and the weights disagree?)"
        )
    if not _rope_heads(name, m):
        return reader.read(key, box)
    hd = m.dim // m.n_heads
    (r0, r1), cols = box
    h0, h1 = r0 // hd, -(-r1 // hd)
    rows = _from_hf_rows(reader.read(key, ((h0 * hd, h1 * hd), cols)), hd)
    return rows[r0 - h0 * hd : r1 - h0 * hd]


def _expected_shape(name: str, m: ModelConfig) -> list[int]:
    hd = m.dim // m.n_heads
    if name.endswith("norm.weight"):
        return [m.dim]
    shapes = {
        "tok_embeddings.weight": [m.vocab_size, m.dim],
        "output.weight": [m.vocab_size, m.dim],
        "attention.wq.weight": [m.n_heads * hd, m.dim],
        "attention.wk.weight": [m.n_kv_heads * hd, m.dim],
        "attention.wv.weight": [m.n_kv_heads * hd, m.dim],
        "attention.wo.weight": [m.dim, m.n_heads * hd],
        "feed_forward.w1.weight": [m.ffn_dim, m.dim],
        "feed_forward.w3.weight": [m.ffn_dim, m.dim],
        "feed_forward.w2.weight": [m.dim, m.ffn_dim],
    }
    for suffix, shape in shapes.items():
        if name.endswith(suffix):
            return shape
    raise KeyError(name)


def _local_box(p) -> tuple[tuple[int, int], ...] | None:
    """This rank's box of a DTensor's global tensor, when its placements
    make it one box (Shard / Replicate); None otherwise."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if any(type(pl) not in (Shard, Replicate) for pl in p.placements):
        return None
    shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
    return tuple((o, o + n) for o, n in zip(offset, shape, strict=True))


@torch.no_grad()
def load_hf_weights(model: nn.Module, path: str, m: ModelConfig) -> int:
    """Overwrite every parameter of ``model`` (already materialized, any
    layout) with the HF weights in ``path``. Returns the bytes this rank read."""
    from torch.distributed.tensor import DTensor, Replicate

    reader = HFReader(path)
    for raw, p in model.named_parameters():
        name = canonical_name(raw)
        if isinstance(p, DTensor):
            local = p.to_local()
            box = _local_box(p)
            if box is not None:
                t = read_box(name, reader, m, box)
                if list(t.shape) != list(local.shape):  # pragma: no cover - internal invariant
                    raise AssertionError((name, t.shape, local.shape))
                local.copy_(t.to(local.dtype))
                continue
            full = read_box(name, reader, m, tuple((0, n) for n in p.shape)).to(
                device=local.device, dtype=p.dtype
            )
            rep = DTensor.from_local(full, p.device_mesh, [Replicate()] * p.device_mesh.ndim, run_check=False)
            local.copy_(rep.redistribute(p.device_mesh, p.placements).to_local())
        else:
            p.copy_(read_box(name, reader, m, tuple((0, n) for n in p.shape)).to(p.dtype))
    return reader.bytes_read


def hf_config(m: ModelConfig, base: dict | None = None) -> dict:
    """config.json for meshrun's model (untied output), over ``base`` (the
    source config.json, for token ids and other fields meshrun leaves alone)."""
    cfg = dict(base or {})
    for k in ("rope_scaling", "rope_parameters", "torch_dtype", "dtype", "transformers_version"):
        cfg.pop(k, None)
    cfg.update(
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": m.dim,
            "num_hidden_layers": m.n_layers,
            "num_attention_heads": m.n_heads,
            "num_key_value_heads": m.n_kv_heads,
            "head_dim": m.dim // m.n_heads,
            "intermediate_size": m.ffn_dim,
            "vocab_size": m.vocab_size,
            "rms_norm_eps": m.norm_eps,
            "rope_theta": m.rope_theta,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": False,
            "max_position_embeddings": max(int(cfg.get("max_position_embeddings", 0)), m.seq_len),
            "torch_dtype": "float32",
        }
    )
    if m.rope_scaling_factor > 0:
        cfg["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": m.rope_scaling_factor,
            "low_freq_factor": m.rope_low_freq_factor,
            "high_freq_factor": m.rope_high_freq_factor,
            "original_max_position_embeddings": m.rope_original_max_positions,
        }
    return cfg


def _write_side_files(out: Path, m: ModelConfig, src: str) -> None:
    base = json.loads((Path(src) / "config.json").read_text()) if src else None
    (out / "config.json").write_text(json.dumps(hf_config(m, base), indent=2) + "\n")
    for f in SIDE_FILES if src else ():
        if (Path(src) / f).is_file():
            shutil.copyfile(Path(src) / f, out / f)


def _save(tensors: dict[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file

    tmp = path.with_suffix(".tmp")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, path)


def _write_index(out: Path, files: list[str]) -> None:
    from safetensors import safe_open

    weight_map, total = {}, 0
    for fname in files:
        with safe_open(str(out / fname), framework="pt") as f:
            for k in f:
                weight_map[k] = fname
                sl = f.get_slice(k)
                n = 1
                for d in sl.get_shape():
                    n *= d
                total += n * 4
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / SAFE_INDEX).write_text(json.dumps(index, indent=2) + "\n")


@torch.no_grad()
def export_live(parts: list[nn.Module], mesh, dims, m: ModelConfig, out_dir: str, src_hf: str = "") -> None:
    """Collective over all ranks: write the model in HF format to
    ``out_dir`` (a path every writer reaches: shared FS on clusters). One
    parameter is gathered at a time; the first rank of each pipeline stage
    writes that stage's file, rank 0 the config and the index."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    out = Path(out_dir)
    pp_rank = mesh["pp"].get_local_rank() if dims.pp > 1 else 0
    # The writer of a pipeline rank: its first dp/tp coordinate.
    coords = [mesh[n].get_local_rank() for n in ("dp_replicate", "dp_shard", "tp")]
    writer = all(c == 0 for c in coords)
    tensors: dict[str, torch.Tensor] = {}
    for part in parts:
        for raw, p in part.named_parameters():
            name = canonical_name(raw)
            full = p.full_tensor() if isinstance(p, DTensor) else p.detach()
            if writer:
                tensors[hf_key(name)] = to_hf(name, full.float().cpu(), m)
    fname = SAFE_SINGLE if dims.pp == 1 else f"model-{pp_rank + 1:05d}-of-{dims.pp:05d}.safetensors"
    if dist.get_rank() == 0:
        out.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    if writer:
        _save(tensors, out / fname)
    dist.barrier()
    if dist.get_rank() == 0:
        if dims.pp > 1:
            _write_index(out, [f"model-{r + 1:05d}-of-{dims.pp:05d}.safetensors" for r in range(dims.pp)])
        _write_side_files(out, m, src_hf)
    dist.barrier()
