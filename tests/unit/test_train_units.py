"""Unit checks of the trainer's pure pieces: ranks from the environment,
layout validation, LR schedule, pipeline stage split."""

from __future__ import annotations

import os

import pytest

from launcher.config.schema import ModelConfig, RunConfig, TrainConfig
from launcher.config.validate import ConfigError
from launcher.plan.make import make_plan
from train.loop.optim import lr_factor
from train.parallel.dist import dist_info_from_env
from train.parallel.mesh import ParallelDims
from train.parallel.pipestages import layer_ranges, stage_ids_for_rank


def test_ranks_from_torchrun_env(monkeypatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "MASTER_PORT": "29500"}
    info = dist_info_from_env("cuda", env)
    assert (info.rank, info.world_size, info.local_rank, info.node_rank) == (5, 8, 1, 1)
    assert (info.device, info.backend, info.master_port) == ("cuda:1", "nccl", 29500)
    # srun --gpus-per-task: each task sees only its own GPU.
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert dist_info_from_env("cuda", env).device == "cuda:0"


def test_ranks_from_slurm_env() -> None:
    env = {
        "SLURM_PROCID": "6",
        "SLURM_NTASKS": "8",
        "SLURM_LOCALID": "2",
        "SLURM_NODEID": "1",
        "SLURM_TASKS_PER_NODE": "4(x2)",
        "MASTER_ADDR": "node1",
        "MASTER_PORT": "12345",
    }
    info = dist_info_from_env("cpu", env)
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size, info.node_rank) == (
        6,
        8,
        2,
        4,
        1,
    )
    assert (info.device, info.backend, info.master_addr) == ("cpu", "gloo", "node1")


def test_no_env_is_one_process() -> None:
    info = dist_info_from_env("cpu", {})
    assert (info.rank, info.world_size, info.master_port) == (0, 1, 0)


def test_rank_outside_world_is_rejected() -> None:
    with pytest.raises(ValueError, match="outside the world size"):
        dist_info_from_env("cpu", {"RANK": "4", "WORLD_SIZE": "4"})


@pytest.mark.parametrize(
    ("dims", "model", "match"),
    [
        (ParallelDims(1, 1, 2, 1, 4), ModelConfig(), "does not match the 4 ranks"),
        (ParallelDims(1, 1, 1, 8, 8), ModelConfig(n_heads=4, n_kv_heads=2), "parallelism.tp=8"),
        (ParallelDims(8, 1, 1, 1, 8), ModelConfig(n_layers=4), "exceeds model.n_layers=4"),
    ],
)
def test_bad_layouts_are_clear_errors(dims: ParallelDims, model: ModelConfig, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        dims.validate(model)


def test_compile_with_tp_keeps_sequence_parallel_norms_eager(tmp_path, monkeypatch) -> None:
    """Compiled SP norms lost their TP gradient reduction (verify_parallel's
    dp2_tp2_compiled): with TP only attention and feed-forward compile; each
    rank gets its own Inductor cache."""
    import torch

    from train.models.llama import Llama
    from train.parallel.parallelize import apply_compile

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    compiled = torch._dynamo.eval_frame.OptimizedModule
    with torch.device("meta"):
        tp_model, plain = Llama(ModelConfig()), Llama(ModelConfig())
    apply_compile(tp_model, tp=True)
    for block in tp_model.layers.values():
        assert isinstance(block.attention, compiled) and isinstance(block.feed_forward, compiled)
        assert not isinstance(block.attention_norm, compiled) and not isinstance(block.ffn_norm, compiled)
    apply_compile(plain, tp=False)
    assert all(isinstance(b, compiled) for b in plain.layers.values())
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "rank0")
    ParallelDims(1, 1, 2, 2, 4).validate(ModelConfig(), compile=True)  # no longer refused


def test_dims_from_plan_validate() -> None:
    cfg = RunConfig()
    cfg.cluster.local_processes = 4
    cfg.parallelism.tp = 2
    plan = make_plan(cfg)
    dims = ParallelDims.from_plan(plan, 4)
    dims.validate(cfg.model)
    assert dims.names() == {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "cp": 1, "tp": 2}


def test_lr_warmup_then_cosine() -> None:
    t = TrainConfig(steps=20, warmup_steps=4, min_lr_ratio=0.1)
    f = [lr_factor(s, t) for s in range(20)]
    assert f[:4] == sorted(f[:4]) and f[0] > 0
    assert f[4] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(f[4:], f[5:], strict=False))
    assert lr_factor(20, t) == pytest.approx(0.1)


def test_layer_split_and_stage_placement() -> None:
    assert [list(r) for r in layer_ranges(4, 2)] == [[0, 1], [2, 3]]
    sizes = [len(r) for r in layer_ranges(10, 4)]
    assert sum(sizes) == 10 and sizes == [2, 3, 3, 2]
    assert stage_ids_for_rank(0, 2, 2, "interleaved_1f1b") == [0, 2]
    assert stage_ids_for_rank(0, 2, 2, "zbv") == [0, 3]
    assert stage_ids_for_rank(1, 2, 2, "zbv") == [1, 2]
