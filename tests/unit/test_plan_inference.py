"""The planner for job=eval / job=generate: the smallest model copy (tp x pp
ranks) whose share of the weights (and generate's KV cache) fits a GPU of
the cluster, the reason in the plan; a model that fits no layout is refused
naming its memory terms. Pure planning: nothing runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.config.compose import compose
from launcher.config.validate import ConfigError
from launcher.plan.make import make_plan

TOKENIZER = Path(__file__).parent.parent / "data" / "hf_tiny" / "tokenizer.json"


@pytest.fixture
def weights(tmp_path: Path) -> list[str]:
    step = tmp_path / "run" / "checkpoints" / "step_1"
    step.mkdir(parents=True)
    (step / "manifest.json").write_text("{}")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    return [f"job.checkpoint={tmp_path / 'run'}", f"job.tokenizer={TOKENIZER}", f"job.prompts={prompts}"]


def plan(kind: str, weights: list[str], *extra: str):
    job = weights if kind == "generate" else [*weights[:1], "job.eval_batches=1"]
    return make_plan(compose([f"job={kind}", *job, *extra]))


def test_generate_takes_the_smallest_tensor_parallel_degree_that_fits(weights) -> None:
    p = plan("generate", weights, "model=70b", "cluster=1node")
    # 70B in bf16 is 141 GB: tp=2 leaves 70 GB of weights per GPU, and the KV
    # cache and overhead on top exceed 80 GB; tp=4 fits.
    assert (p.tp, p.pp, p.dp_shard) == (4, 1, 2)
    why = p.reasons[0]
    assert "tp=4 pp=1 is the smallest layout" in why and "tp=2 pp=1 would need" in why
    assert "KV cache" in why and "2 replicas" in why
    assert p.memory.fits and p.memory.grads_gb == 0 and p.memory.optimizer_gb == 0
    assert p.memory.kv_cache_gb > 0
    # No training checkpoint to wait for on a preemption signal.
    assert not any("grace_time_s" in w for w in p.warnings)
    small = plan("generate", weights, "model=8b", "cluster=1node")
    assert (small.tp, small.dp_shard) == (1, 8)
    # More sequences in flight: a bigger KV cache, a wider layout.
    assert plan("generate", weights, "model=8b", "cluster=1node", "job.batch_size=128").tp > 1


def test_eval_adds_pipeline_stages_across_nodes(weights) -> None:
    p = plan("eval", weights, "model=405b", "cluster=4node")
    assert (p.tp, p.pp) == (8, 2) and p.dp_shard == 2
    assert "tp=8 pp=2 is the smallest layout" in p.reasons[0]
    # No pipeline inside one node when tensor parallel alone fits.
    one = plan("eval", weights, "model=70b", "cluster=1node")
    assert (one.tp, one.pp) == (4, 1) and one.memory.fits


@pytest.mark.parametrize(
    ("kind", "fix"),
    [("generate", "job=generate runs no pipeline stages"), ("eval", "more nodes for pipeline stages")],
)
def test_a_model_that_cannot_fit_is_refused_naming_the_memory_terms(weights, kind, fix) -> None:
    with pytest.raises(ConfigError) as e:
        plan(kind, weights, "model=405b", "cluster=1node")
    msg = str(e.value)
    assert f"model=405b does not fit job={kind} on cluster=1node" in msg
    assert "tp=8 pp=1" in msg and "parameters 101.5" in msg and "cluster.gpu_mem_gb" in msg
    assert "Biggest term: parameters" in msg and fix in msg
    if kind == "generate":
        assert "KV cache" in msg


def test_generate_refuses_pipeline_stages(weights) -> None:
    with pytest.raises(ConfigError, match="parallelism.pp=2 is invalid.*job=generate decodes on replicas"):
        plan("generate", weights, "model=tiny", "parallelism.pp=2")
