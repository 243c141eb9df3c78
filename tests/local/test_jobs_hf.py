"""Hugging Face interop (job=finetune / export): a small Llama built by
transformers from a config (random weights, nothing downloaded), saved with
save_pretrained, loaded by meshrun's own builder under FSDP and under TP (2
gloo ranks): logits match transformers' in fp32 to 1e-5. Fine-tuned for a
few steps through the launcher's local path with job.export_hf, the export
loads in transformers and matches meshrun's logits of the checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jobs_util
import numpy as np
import pytest
import torch
import transformers
from jobs_util import VOCAB, make_hf_dir, write_tokens
from safetensors import safe_open

from launcher.config.compose import compose
from launcher.config.spec import RunSpec
from launcher.config.validate import ConfigError
from launcher.plan.make import make_plan
from launcher.run.local import free_port, rank_env, run_local

WORKER = Path(__file__).parent.parent / "hf_logits_worker.py"
SEQ = 32


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    return make_hf_dir(tmp_path_factory.mktemp("hf_llama"))


@pytest.fixture(scope="module")
def tokens_dir(tmp_path_factory) -> Path:
    toks = np.random.default_rng(1).integers(0, VOCAB, 4000)
    return write_tokens(tmp_path_factory.mktemp("ft_tokens"), toks)


def make_run(run_dir: Path, overrides: list[str]) -> RunSpec:
    return jobs_util.make_run(run_dir, [f"model.seq_len={SEQ}", *overrides])


def meshrun_logits(spec: RunSpec, tokens, expect_logits: bool = True) -> torch.Tensor | None:
    """Logits of the model the trainer's builder makes for ``spec``, on 2 ranks."""
    torch.save(tokens, Path(spec.run_dir) / "tokens.pt")
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), spec.run_dir],
            env=rank_env(spec, r, port),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(spec.plan.world_size)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    return torch.load(Path(spec.run_dir) / "logits.pt") if expect_logits else None


def test_loaded_under_pipeline_parallel(hf_dir, tmp_path) -> None:
    """pp=2: each stage holds its layers with the file's values (the logits
    tests above prove the layout conversion itself)."""
    spec = make_run(
        tmp_path,
        [
            "job=finetune",
            "model=hf",
            f"job.hf_path={hf_dir}",
            "parallelism.mode=fsdp_tp_pp",
            "parallelism.pp=2",
            "parallelism.tp=1",
        ],
    )
    assert spec.plan.pp == 2
    meshrun_logits(spec, fixed_tokens(), expect_logits=False)
    stages = [json.loads((tmp_path / f"stage_rank{r}.json").read_text()) for r in range(2)]
    keys = {k for k in stages[0]} | {k for k in stages[1]}
    assert not set(stages[0]) & set(stages[1])  # each layer on one stage
    with safe_open(str(hf_dir / "model.safetensors"), framework="pt") as f:
        assert keys == set(f.keys())
    assert max(v for s in stages for v in s.values()) == 0.0


def hf_logits(path: Path, tokens) -> torch.Tensor:
    model = transformers.LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(tokens).logits


def fixed_tokens() -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(7).integers(0, VOCAB, (2, SEQ))).long()


@pytest.mark.parametrize(
    "layout",
    [
        pytest.param(["parallelism.mode=fsdp"], id="fsdp"),
        pytest.param(["parallelism.mode=fsdp_tp", "parallelism.tp=2"], id="tp"),
    ],
)
def test_loaded_logits_match_transformers(hf_dir, tmp_path, layout) -> None:
    spec = make_run(tmp_path, ["job=finetune", "model=hf", f"job.hf_path={hf_dir}", *layout])
    assert (spec.plan.dp, spec.plan.tp) == ((2, 1) if layout[0].endswith("fsdp") else (1, 2))
    tokens = fixed_tokens()
    ours, ref = meshrun_logits(spec, tokens), hf_logits(hf_dir, tokens)
    assert ours.shape == ref.shape == (2, SEQ, VOCAB)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-5)
    # Each rank read only its shard's rows / columns, not the whole file.
    total = (hf_dir / "model.safetensors").stat().st_size
    for r in range(2):
        read = int((Path(spec.run_dir) / f"bytes_read_rank{r}").read_text())
        assert 0.3 * total < read < 0.6 * total, (r, read, total)


def test_finetune_export_loads_in_transformers(hf_dir, tokens_dir, tmp_path) -> None:
    export = tmp_path / "export"
    ft = make_run(
        tmp_path / "ft",
        [
            "job=finetune",
            "model=hf",
            f"job.hf_path={hf_dir}",
            f"job.export_hf={export}",
            "data=tokens",
            f"data.path={tokens_dir}",
            "data.use_dali=false",
            "parallelism.mode=fsdp",
            "train.steps=3",
            "train.lr=1e-2",
            "train.warmup_steps=0",
        ],
    )
    assert run_local(ft, echo=None) == 0, (Path(ft.run_dir) / "logs" / "rank0.log").read_text()[-3000:]
    assert json.loads((Path(ft.run_dir) / "result.json").read_text())["status"] == "completed"
    assert sorted(p.name for p in export.iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
    ]
    # meshrun's logits of the fine-tuned checkpoint, loaded under TP.
    check = make_run(
        tmp_path / "check",
        [
            "job=finetune",
            "model=hf",
            f"job.hf_path={hf_dir}",
            f"job.checkpoint={ft.run_dir}",
            "parallelism.mode=fsdp_tp",
            "parallelism.tp=2",
        ],
    )
    tokens = fixed_tokens()
    ours = meshrun_logits(check, tokens)
    torch.testing.assert_close(ours, hf_logits(export, tokens), rtol=0, atol=1e-5)
    # The steps changed the weights (else the match would prove nothing about export).
    assert (ours - hf_logits(hf_dir, tokens)).abs().max() > 1e-2
    # The offline exporter (one process, from the checkpoint files) agrees.
    offline = tmp_path / "offline"
    done = subprocess.run(
        [sys.executable, "-m", "train.jobs.export", ft.run_dir, str(offline)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "step_3" in done.stdout
    torch.testing.assert_close(hf_logits(offline, tokens), ours, rtol=0, atol=1e-5)


def test_shape_mismatch_is_a_clear_error(hf_dir) -> None:
    with pytest.raises(ConfigError) as e:
        make_plan(compose(["job=finetune", "model=tiny", f"job.hf_path={hf_dir}"]))
    msg = str(e.value)
    assert "model=tiny does not match" in msg and "model.vocab_size=256 but config.json says 128" in msg
    assert "model=hf" in msg


def test_finetune_needs_weights() -> None:
    with pytest.raises(ConfigError, match="job=finetune needs weights"):
        make_plan(compose(["job=finetune"]))


def test_llama3_rope_scaling_and_tied_embeddings_round_trip(tmp_path) -> None:
    """Llama 3.x configs: 'llama3' RoPE scaling and a tied output layer load
    (one process) with transformers' logits, and export back untied."""
    from launcher.config.schema import ModelConfig
    from launcher.plan.jobs import hf_model_shape
    from train.models.hf import _save, hf_config, hf_key, load_hf_weights, to_hf
    from train.models.llama import Llama, rope_cos_sin

    torch.manual_seed(1)
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        vocab_size=VOCAB,
        max_position_embeddings=256,
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
        tie_word_embeddings=True,
    )
    src = tmp_path / "src"
    transformers.LlamaForCausalLM(config).save_pretrained(src)
    shape = hf_model_shape(json.loads((src / "config.json").read_text()))
    assert shape["rope_scaling_factor"] == 8.0 and shape["rope_original_max_positions"] == 16
    m = ModelConfig(name="hf", seq_len=64, **shape)
    with torch.device("meta"):
        model = Llama(m)
    model.to_empty(device="cpu")
    model.rope = rope_cos_sin(m.dim // m.n_heads, m.seq_len, m.rope_theta, m=m)
    load_hf_weights(model, str(src), m)
    tokens = torch.from_numpy(np.random.default_rng(2).integers(0, VOCAB, (2, 64))).long()
    with torch.no_grad():
        ours = model(tokens)
    torch.testing.assert_close(ours, hf_logits(src, tokens), rtol=0, atol=1e-5)
    out = tmp_path / "out"
    out.mkdir()
    _save(
        {hf_key(n): to_hf(n, p.detach(), m) for n, p in model.named_parameters()}, out / "model.safetensors"
    )
    (out / "config.json").write_text(json.dumps(hf_config(m)))
    torch.testing.assert_close(hf_logits(out, tokens), ours, rtol=0, atol=1e-5)
