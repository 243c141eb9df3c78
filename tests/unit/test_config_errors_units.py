"""Bad overrides fail before anything runs: non-zero exit, one message naming
the field, the bad value and the valid choices or range.

Here: its tests that start no process, no process group and no server
(tier unit); the rest: tests/local/test_config_errors.py."""

from __future__ import annotations

import pytest

from launcher.config.compose import compose
from launcher.config.validate import ConfigError
from launcher.plan.make import make_plan

# (overrides, substrings the message must contain)
BAD = [
    (["cluster=bogus"], ["unknown cluster option 'bogus'", "choose one of", "4node", "local"]),
    (["model=bogus"], ["unknown model option 'bogus'", "choose one of", "13b"]),
    (["qos=bogus"], ["unknown qos option 'bogus'", "research", "training", "inference"]),
    (["parallelism=bogus"], ["unknown parallelism option 'bogus'", "fsdp_tp_pp"]),
    (["model.foo=1"], ["unknown key 'model.foo'"]),
    (["model.dim=abc"], ["model.dim", "abc"]),
    (["parallelism.mode=zero3"], ["parallelism.mode='zero3'", "auto, fsdp, hsdp, fsdp_tp, fsdp_tp_pp"]),
    (["parallelism.precision=fp16"], ["parallelism.precision='fp16'", "fp32", "bf16"]),
    (["parallelism.pp_schedule=wave"], ["parallelism.pp_schedule", "1f1b", "interleaved_1f1b"]),
    (["model=7b", "cluster=1node", "parallelism.tp=3"], ["parallelism.tp=3", "n_heads=32"]),
    (["model=7b", "cluster=2node", "parallelism.tp=16"], ["parallelism.tp=16", "<= 8 GPUs per node"]),
    (
        [
            "cluster=1node",
            "parallelism.dp_replicate=3",
            "parallelism.dp_shard=2",
            "parallelism.tp=1",
            "parallelism.pp=1",
        ],
        ["dp_replicate=3 dp_shard=2", "multiply to the 8 ranks"],
    ),
    (["model=405b", "cluster=1node"], ["model=405b does not fit", "80 GB", ">= 32"]),
    (
        ["cluster.local_processes=4", "model.n_layers=2", "parallelism.pp=4", "parallelism.tp=1"],
        ["parallelism.pp=4", "n_layers=2"],
    ),
    (
        ["cluster.local_processes=4", "model.n_layers=8", "parallelism.pp=8", "parallelism.tp=1"],
        ["parallelism.tp=1 x parallelism.pp=8", "must divide the 4 ranks"],
    ),
    (["cluster.nodes=0"], ["cluster.nodes=0", ">= 1"]),
    (["cluster.local_processes=0"], ["cluster.local_processes=0", ">= 1"]),
    (["model.dim=0"], ["model.dim=0", ">= 1"]),
    (["train.steps=-5"], ["train.steps=-5", ">= 1"]),
    (["parallelism.tp=-2"], ["parallelism.tp=-2", ">= 1, or 0 to let meshrun choose"]),
    (["train.global_batch_size=7"], ["train.global_batch_size=7", "divisible by the data-parallel degree 2"]),
    (["train.micro_batch_size=3"], ["train.micro_batch_size=3", "per-replica batch 4"]),
    (["storage=nvme_s3"], ["storage.s3_bucket=''", "storage.s3_bucket=<bucket>"]),
    (["model.n_heads=3"], ["model.n_heads=3", "divide model.dim=64"]),
    (["parallelism.offload_params=true"], ["parallelism.offload_params", "never offloads"]),
    (
        [
            "cluster.local_processes=4",
            "parallelism.pp=2",
            "parallelism.tp=1",
            "parallelism.pp_schedule=interleaved_1f1b",
        ],
        ["parallelism.stages_per_rank=1", "needs >= 2"],
    ),
    (
        ["cluster=4node", "cluster.container_image=nvcr.io/nvidia/pytorch:25.01-py3", "cluster.pyxis=false"],
        ["cluster.container_image", "Pyxis"],
    ),
    (["data=tokens", "data.path="], ["data.path=''", "data.path=<dir>"]),
    (
        ["model=vit_tiny", "data=images", "cluster.local_processes=4", "parallelism.tp=2"],
        ["tp=2 pp=1", "ViT", "tp=1 pp=1"],
    ),
]


@pytest.mark.parametrize(("overrides", "expected"), BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_input_is_rejected_with_a_clear_message(overrides: list[str], expected: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        make_plan(compose(overrides))
    for text in expected:
        assert text in str(info.value), (text, str(info.value))


@pytest.mark.parametrize(
    ("bad", "want"),
    [
        # A whole quoted list is one string: each item is quoted instead.
        ("job.args=[--lr=3e-4,--name=a b,plain]", 'job.args=["--lr=3e-4","--name=a b","plain"]'),
        ("train.name=a=b", 'train.name="a=b"'),
    ],
)
def test_an_unreadable_override_gets_a_quoted_form_that_composes(bad: str, want: str) -> None:
    import shlex

    from launcher.config.overrides import grammar_error

    msg = grammar_error([bad])
    assert msg is not None and msg.endswith(f"'{want}'"), msg
    (fixed,) = shlex.split(msg.rsplit("): ", 1)[1])
    assert fixed == want and grammar_error([fixed]) is None
    if bad.startswith("job.args"):
        assert compose(["job=script", fixed]).job.args == ["--lr=3e-4", "--name=a b", "plain"]
