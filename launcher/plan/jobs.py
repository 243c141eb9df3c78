"""Job kinds (``job=pretrain|finetune|eval|generate``): the launcher-side
checks, and the model shape read from a Hugging Face ``config.json``.

Torch-free (json only): a dry run of a fine-tune checks the weights
directory without loading a tensor. Paths are made absolute here, because
tasks may start in another working directory.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from launcher.config.datasets import read_prompts
from launcher.config.schema import RunConfig
from launcher.config.validate import ConfigError, fail
from launcher.plan.script import check_script

HF_CONFIG = "config.json"
# config.json key -> model.<field>: the shape meshrun's Llama takes.
HF_SHAPE = {
    "hidden_size": "dim",
    "num_hidden_layers": "n_layers",
    "num_attention_heads": "n_heads",
    "num_key_value_heads": "n_kv_heads",
    "intermediate_size": "ffn_dim",
    "vocab_size": "vocab_size",
    "rms_norm_eps": "norm_eps",
    "rope_theta": "rope_theta",
}
HF_MODEL_TYPES = ("llama", "mistral")


def read_hf_config(path: str) -> dict[str, Any]:
    """``<path>/config.json`` as a dict; ConfigError naming job.hf_path."""
    p = Path(path) / HF_CONFIG
    if not Path(path).is_dir():
        raise fail(
            "job.hf_path", path, "not a directory (a Hugging Face model dir: config.json + *.safetensors)"
        )
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise fail("job.hf_path", path, f"no readable {HF_CONFIG} in it ({e})") from e


def rope_of(hf: dict[str, Any]) -> dict[str, Any]:
    """model.rope_* fields of a config.json. transformers >= 5 writes
    ``rope_parameters``; older ones ``rope_theta`` + ``rope_scaling``."""
    params = dict(hf.get("rope_scaling") or {})
    params.update(hf.get("rope_parameters") or {})
    kind = params.get("rope_type") or params.get("type") or "default"
    out: dict[str, Any] = {"rope_theta": float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))}
    if kind == "default":
        return {**out, "rope_scaling_factor": 0.0}
    if kind != "llama3":
        raise ConfigError(
            f"job.hf_path: config.json asks for rope_type={kind!r}; meshrun's Llama implements the "
            "default rotary embedding and Llama 3.1's 'llama3' scaling"
        )
    return {
        **out,
        "rope_scaling_factor": float(params["factor"]),
        "rope_low_freq_factor": float(params.get("low_freq_factor", 1.0)),
        "rope_high_freq_factor": float(params.get("high_freq_factor", 4.0)),
        "rope_original_max_positions": int(params.get("original_max_position_embeddings", 8192)),
    }


def hf_model_shape(hf: dict[str, Any]) -> dict[str, Any]:
    """model.<field> values of a Llama-family config.json; ConfigError for
    architectures meshrun's model cannot represent."""
    if hf.get("model_type") not in HF_MODEL_TYPES:
        raise ConfigError(
            f"job.hf_path: config.json has model_type={hf.get('model_type')!r}; "
            f"meshrun loads {' or '.join(HF_MODEL_TYPES)} (Llama-family) weights"
        )
    if hf.get("hidden_act", "silu") != "silu":
        raise ConfigError(
            f"job.hf_path: config.json has hidden_act={hf['hidden_act']!r}; meshrun's MLP is SwiGLU (silu)"
        )
    for key in ("attention_bias", "mlp_bias"):
        if hf.get(key):
            raise ConfigError(f"job.hf_path: config.json has {key}=true; meshrun's Llama has no biases")
    missing = [
        k for k in HF_SHAPE if k not in hf and k not in ("num_key_value_heads", "rope_theta", "rms_norm_eps")
    ]
    if missing:
        raise ConfigError(f"job.hf_path: config.json lacks {', '.join(missing)}")
    shape = {
        "dim": int(hf["hidden_size"]),
        "n_layers": int(hf["num_hidden_layers"]),
        "n_heads": int(hf["num_attention_heads"]),
        "n_kv_heads": int(hf.get("num_key_value_heads") or hf["num_attention_heads"]),
        "ffn_dim": int(hf["intermediate_size"]),
        "vocab_size": int(hf["vocab_size"]),
        "norm_eps": float(hf.get("rms_norm_eps", 1e-6)),
        **rope_of(hf),
    }
    head_dim = hf.get("head_dim")
    if head_dim is not None and int(head_dim) * shape["n_heads"] != shape["dim"]:
        raise ConfigError(
            f"job.hf_path: config.json has head_dim={head_dim} != hidden_size / num_attention_heads "
            f"= {shape['dim'] // shape['n_heads']}; meshrun's attention needs them equal"
        )
    return shape


def apply_hf_shape(cfg: RunConfig, hf: dict[str, Any]) -> None:
    """model=hf: take the shape from config.json. Any other preset must
    already match it; a mismatch names every differing field."""
    shape = hf_model_shape(hf)
    m = cfg.model
    if m.name == "hf":
        for k, v in shape.items():
            setattr(m, k, v)
        return
    if m.family != "llama":
        raise fail("model.family", m.family, "job.hf_path holds Llama-family weights: use a llama model")
    diffs = [
        f"model.{k}={getattr(m, k)!r} but config.json says {v!r}"
        for k, v in shape.items()
        if (abs(getattr(m, k) - v) > 1e-12 * max(1.0, abs(v)) if isinstance(v, float) else getattr(m, k) != v)
    ]
    if diffs:
        raise ConfigError(
            f"model={m.name} does not match job.hf_path={cfg.job.hf_path}: {'; '.join(diffs)} "
            "(choose model=hf to take the shape from config.json)"
        )


def _abs(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path)) if path else path


# Run dirs of pipeline stages that run before the one being checked
# (launcher/commands/pipeline.py): a checkpoint in one exists only once that stage ran.
_AWAITED: contextvars.ContextVar[tuple[Path, ...]] = contextvars.ContextVar("awaited", default=())


@contextlib.contextmanager
def awaiting(run_dirs: list[str]) -> Iterator[None]:
    """Within: a job.checkpoint in one of ``run_dirs`` is not checked for existence."""
    token = _AWAITED.set(tuple(Path(d).resolve() for d in run_dirs))
    try:
        yield
    finally:
        _AWAITED.reset(token)


def _awaited(path: str) -> bool:
    p = Path(path).resolve()
    return any(p == d or d in p.parents for d in _AWAITED.get())


def check_job(cfg: RunConfig) -> None:
    """Field checks of cfg.job (and the model shape it implies); fills
    model=hf's shape and makes job paths absolute. Raises ConfigError."""
    j = cfg.job
    if j.kind == "script":  # a team's own program: its own checks (launcher/plan/script.py)
        check_script(cfg)
        return
    for name in ("hf_path", "checkpoint", "export_hf", "prompts", "output", "tokenizer"):
        setattr(j, name, _abs(getattr(j, name)))
    if j.hf_path:
        apply_hf_shape(cfg, read_hf_config(j.hf_path))
    elif cfg.model.name == "hf":
        raise fail(
            "job.hf_path", j.hf_path, "model=hf takes its shape from job.hf_path's config.json: set it"
        )
    if j.checkpoint and not _awaited(j.checkpoint):
        _check_checkpoint(j.checkpoint)
    if j.kind == "pretrain" and (j.hf_path or j.checkpoint):
        field = "job.hf_path" if j.hf_path else "job.checkpoint"
        raise fail(
            field, getattr(j, field.split(".")[1]), "job=pretrain starts from random init: use job=finetune"
        )
    if j.kind in ("finetune", "eval", "generate") and not (j.hf_path or j.checkpoint):
        raise fail(
            "job.hf_path",
            j.hf_path,
            f"job={j.kind} needs weights: set job.hf_path=<Hugging Face dir> or job.checkpoint=<run dir>",
        )
    if j.export_hf and j.kind not in ("pretrain", "finetune"):
        raise fail("job.export_hf", j.export_hf, "only job=pretrain or job=finetune train weights to export")
    if j.kind in ("eval", "generate") and cfg.model.family != "llama":
        raise fail("model.family", cfg.model.family, f"job={j.kind} runs Llama-family models")
    if j.eval_batches < 0:
        raise fail("job.eval_batches", j.eval_batches, "must be >= 0 (0: one pass over data.path)")
    if j.kind == "eval" and cfg.data.kind == "synthetic" and not j.eval_batches:
        raise fail(
            "job.eval_batches", 0, "data=synthetic has no end: set a count (or data=tokens data.path=DIR)"
        )
    if j.kind == "generate":
        _check_generate(cfg)


def _check_generate(cfg: RunConfig) -> None:
    j = cfg.job
    if not j.prompts or not Path(j.prompts).is_file():
        raise fail(
            "job.prompts", j.prompts, 'job=generate reads a JSONL file of {"prompt": ...} lines: set it'
        )
    tok = j.tokenizer or (os.path.join(j.hf_path, "tokenizer.json") if j.hf_path else "")
    if not tok or not Path(tok).is_file():
        raise fail(
            "job.tokenizer",
            j.tokenizer,
            "job=generate needs a tokenizer.json (tokenizers library): set job.tokenizer=<file> "
            "or put tokenizer.json in job.hf_path",
        )
    j.tokenizer = tok
    n = tokenizer_size(tok)
    if n > cfg.model.vocab_size:
        raise fail(
            "job.tokenizer",
            tok,
            f"has {n} token ids, more than model.vocab_size={cfg.model.vocab_size}: not this model's tokenizer",
        )
    if j.max_new_tokens < 1:
        raise fail("job.max_new_tokens", j.max_new_tokens, "must be >= 1")
    if j.temperature < 0:
        raise fail("job.temperature", j.temperature, "must be >= 0 (0: greedy)")
    if not 0 < j.top_p <= 1:
        raise fail("job.top_p", j.top_p, "must be in (0, 1]")
    if j.batch_size < 1:
        raise fail("job.batch_size", j.batch_size, "must be >= 1")
    if j.array_tasks < 1:
        raise fail("job.array_tasks", j.array_tasks, "must be >= 1")
    read_prompts(j.prompts)
    if j.array_tasks > 1 and cfg.cluster.kind != "slurm":
        raise fail(
            "job.array_tasks", j.array_tasks, "job arrays need a Slurm cluster (cluster=local runs one task)"
        )


def _check_checkpoint(path: str) -> None:
    """A checkpoint dir (manifest.json: complete) or a run dir holding one."""
    p = Path(path)
    if not p.is_dir():
        raise fail("job.checkpoint", path, "not a directory (a meshrun run dir or its checkpoints/step_N)")
    if (p / "manifest.json").is_file():
        return
    roots = [p / "checkpoints"]
    try:
        from launcher.config.spec import load_spec

        roots.insert(0, Path(load_spec(p).checkpoint_dir))
    except ConfigError:
        pass  # not a run dir: only checkpoints/ can hold them
    if not any(any(r.glob("step_*/manifest.json")) for r in roots):
        raise fail(
            "job.checkpoint",
            path,
            "no complete checkpoint in it (a step_N dir with manifest.json, or a run dir)",
        )


def tokenizer_size(path: str) -> int:
    """Token ids a tokenizer.json can produce (its vocabulary + added tokens)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise fail("job.tokenizer", path, f"not a readable tokenizer.json ({e})") from e
    vocab = (doc.get("model") or {}).get("vocab") or {}
    ids = list(vocab.values()) if isinstance(vocab, dict) else list(range(len(vocab)))
    ids += [int(t.get("id", 0)) for t in doc.get("added_tokens") or []]
    return max(ids, default=-1) + 1
