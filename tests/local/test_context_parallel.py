"""parallelism.cp (context parallel, issue 37): the refusals (before any run
dir exists), the planner choosing cp > 1 only when memory needs it, the
memory and performance models, and the trainer's sequence sharding.

torch's context_parallel cannot run ring attention on CPU (torch 2.13: the
CPU SDPA kernel has no sharding strategy; train/parallel/cp.py), so no CPU
run trains with cp=2: the trainer's part is tested as far as CPU goes (a
2-rank gloo world: the buffers sharded as torch's load balancer cuts them,
the FSDP mesh over dp_shard x cp, and the SDPA error that keeps cp on GPUs,
which tells us when a torch release lifts it).
Tests that start no process: tests/unit/test_context_parallel_units.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import dry_run

from launcher.config.compose import compose
from launcher.plan.make import make_plan

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "tests" / "data" / "hf_tiny" / "tokenizer.json"


@pytest.fixture
def weights(tmp_path: Path) -> list[str]:
    step = tmp_path / "ckpt" / "checkpoints" / "step_1"
    step.mkdir(parents=True)
    (step / "manifest.json").write_text("{}")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    return [f"job.checkpoint={tmp_path / 'ckpt'}", f"job.tokenizer={TOKENIZER}", f"job.prompts={prompts}"]


GPU8 = ["model=8b", "cluster=1node"]  # 8 x H100 in one node


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (
            [*GPU8, "model.seq_len=8190", "parallelism.cp=2"],
            ["2 x cp must divide model.seq_len=8190", "choose from none (only 1)"],
        ),
        ([*GPU8, "parallelism.cp=16"], ["must divide the 8 ranks; choose from 2, 4, 8"]),
        (
            [*GPU8, "model.seq_len=8200", "parallelism.cp=2"],
            ["2 x cp x tp = 32 (tp=8) must divide model.seq_len=8200: choose from 1 (off)"],
        ),
        ([*GPU8, "parallelism.cp=2", "parallelism.pp=2"], ["does not compose with pipeline parallel"]),
        (
            ["model=vit_b16", "data=images", "cluster=1node", "parallelism.cp=2"],
            ["model.family=vit trains with FSDP/HSDP"],
        ),
        (["parallelism.cp=2"], ["ring attention needs GPU ranks", "on CPU ranks"]),
        ([*GPU8, "job=generate", "parallelism.cp=2"], ["job=generate needs set parallelism.cp=0 or 1"]),
    ],
    ids=["seq_len", "world", "seq_len_tp", "pipeline", "vit", "cpu", "generate"],
)
def test_refused_before_anything_is_written(
    tmp_path: Path, weights: list[str], overrides: list[str], words: list[str]
) -> None:
    run_dir = tmp_path / "run"
    extra = weights if "job=generate" in overrides else []
    proc = dry_run(run_dir, *overrides, *extra)
    assert proc.returncode != 0, proc.stdout[-2000:]
    value = next(o.split("=")[1] for o in overrides if o.startswith("parallelism.cp="))
    assert f"parallelism.cp={value} is invalid" in proc.stderr, proc.stderr
    for w in words:
        assert w in proc.stderr, proc.stderr
    assert not run_dir.exists()


def test_planner_takes_cp_only_when_memory_needs_it(tmp_path: Path) -> None:
    # The default sequence lengths fit without context parallel.
    for shape in (["model=8b", "cluster=2node"], ["model=70b", "cluster=4node"]):
        assert make_plan(compose(shape)).cp == 1, shape
    # 8B at 512k tokens: 128 GB of activations a GPU at cp=1 (full AC,
    # micro-batch 1), half at cp=2.
    long = ["model=8b", "cluster=2node", "model.seq_len=524288"]
    plan = make_plan(compose(long))
    assert (plan.cp, plan.tp, plan.dp) == (2, 8, 1)
    assert plan.memory.fits and any("context parallel 2" in r for r in plan.reasons), plan.reasons
    # A set cp on one node: TP shrinks to a node's ranks / cp (tp=8 leaves no room).
    one_node = make_plan(compose(["model=8b", "cluster=1node", "parallelism.cp=2"]))
    assert (one_node.cp, one_node.tp, one_node.dp) == (2, 4, 1)
    # 70B at 256k on 4 nodes: no cp=1 layout fits either.
    assert make_plan(compose(["model=70b", "cluster=4node", "model.seq_len=262144"])).cp > 1
    proc = dry_run(tmp_path / "run", *long)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = " ".join(proc.stdout.split())
    assert "cp=2 x tp=8 (16 ranks" in text and "tp=8 pp=1 cp=2" in text, text[:3000]
