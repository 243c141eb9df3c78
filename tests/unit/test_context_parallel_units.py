"""parallelism.cp (context parallel, issue 37): the refusals (before any run
dir exists), the planner choosing cp > 1 only when memory needs it, the
memory and performance models, and the trainer's sequence sharding.

torch's context_parallel cannot run ring attention on CPU (torch 2.13: the
CPU SDPA kernel has no sharding strategy; train/parallel/cp.py), so no CPU
run trains with cp=2: the trainer's part is tested as far as CPU goes (a
2-rank gloo world: the buffers sharded as torch's load balancer cuts them,
the FSDP mesh over dp_shard x cp, and the SDPA error that keeps cp on GPUs,
which tells us when a torch release lifts it).

Here: its tests that start no process, no process group and no server
(tier unit); the rest: tests/local/test_context_parallel.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from launcher.config.compose import compose
from launcher.plan.make import make_plan


def test_memory_divides_activations_and_shards_by_cp() -> None:
    from launcher.plan.memory import estimate_memory

    m = compose(["model=8b"]).model
    kw = dict(tp=1, pp=1, dp_shard=4, stages_per_rank=1, micro_batch_size=1, n_microbatches=1)
    kw |= dict(pp_schedule="1f1b", activation_checkpointing="full", precision="bf16")
    kw |= dict(capacity_gb=80.0, overhead_gb=7.0)
    one, two = estimate_memory(m, cp=1, **kw), estimate_memory(m, cp=2, **kw)
    assert two.activations_gb == pytest.approx(one.activations_gb / 2)
    assert two.params_gb == pytest.approx(one.params_gb / 2)  # FSDP over dp_shard x cp
    assert two.unsharded_gb == one.unsharded_gb


def test_ring_attention_bytes_and_overlap() -> None:
    from launcher.perf import comm, predict
    from launcher.perf.ring import GRAD_BYTES, ring_attention

    @dataclasses.dataclass
    class Shape:  # the fields ring_attention reads of launcher/perf/steptime.py's _Shape
        tokens_mb: int = 4096  # this rank's tokens of a micro-batch (seq 16384 / cp 4)
        hd: int = 128
        tp: int = 2
        act_bytes: int = 2
        layers: int = 32
        n_mb: int = 2
        ac: str = "none"
        cpu: bool = False

    class M:
        n_heads = 32

    link = comm.Link("nvlink", 100.0, 5e-6)
    rc = ring_attention(M, 4, Shape(), link, attention_s=0.0)
    elems = 2 * 4096 * 32 * 128 / 2  # K and V, every head (expanded GQA), this TP rank's share
    assert rc.kv_bytes == elems * 2
    # Per layer and micro-batch: 3 K/V passes forward, 3 backward, 3 of the fp32 gradients.
    assert rc.passes == 32 * 2 * (3 + 3 + 3)
    per_layer = 6 * (5e-6 + elems * 2 / 100e9) + 3 * (5e-6 + elems * GRAD_BYTES / 100e9)
    assert rc.total_s == pytest.approx(32 * 2 * per_layer)
    assert rc.exposed_s == rc.total_s  # no attention compute to hide behind
    assert ring_attention(M, 4, Shape(), link, attention_s=rc.total_s / 2).exposed_s == pytest.approx(
        rc.total_s / 2
    )
    assert ring_attention(M, 4, Shape(ac="full"), link, 0.0).passes == 32 * 2 * 12  # the forward's again
    assert ring_attention(M, 1, Shape(), link, 0.0).total_s == 0.0
    # In a prediction: cp=2 halves a rank's tokens; the ring shows up as "cp".
    cfg = compose(["model=8b", "cluster=2node", "model.seq_len=524288"])
    plan = make_plan(cfg)
    pred = predict(cfg, plan)
    ring = [c for c in pred.collectives if c.dim == "cp"]
    assert len(ring) == 1 and ring[0].group == 2 and pred.comm_total_s["cp"] > 0
    one = dataclasses.replace(plan, cp=1, dp_shard=1)
    compute_one = predict(cfg, one).compute_detail["matmul"]
    assert pred.compute_detail["matmul"] == pytest.approx(compute_one / 2, rel=0.05)


def _cp_world(rank: int, world: int, init: str, out: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from launcher.config.schema import ModelConfig
    from train.models.llama import build_meta_model
    from train.parallel.cp import cp_shard
    from train.parallel.mesh import ParallelDims, dp_mesh_for_fsdp

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    dims = ParallelDims(pp=1, dp_replicate=1, dp_shard=1, tp=1, world_size=2, cp=2)
    mesh, dp = dims.build_mesh("cpu")
    lines = [
        f"dp {dp.size()} fsdp {dp_mesh_for_fsdp(mesh, dims).mesh_dim_names} {dp_mesh_for_fsdp(mesh, dims).size()}"
    ]
    m = ModelConfig(seq_len=16)
    model = build_meta_model(m)
    model.rope = torch.arange(16.0).view(16, 1, 1).expand(16, 8, 2).contiguous()
    x = torch.arange(32).view(2, 16)
    y = x + 100
    ctx, xs, ys = cp_shard(mesh["cp"], model, x, y)
    with ctx:
        lines.append(f"x {xs.tolist()} y {ys.tolist()} rope {model.rope[:, 0, 0].tolist()}")
        q = torch.randn(1, 2, 8, 4)
        try:
            F.scaled_dot_product_attention(q, q, q, is_causal=True)
            lines.append("sdpa ran")
        except NotImplementedError as e:
            lines.append(f"sdpa {e}")
    lines.append(f"restored rope {model.rope.shape[0]} x {x.shape[1]}")
    Path(out, f"rank{rank}.txt").write_text("\n".join(lines))
    dist.destroy_process_group()


def test_trainer_shards_sequences_over_cp_ranks(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    from launcher.config.schema import ModelConfig
    from launcher.config.validate import ConfigError
    from train.parallel.mesh import ParallelDims

    with pytest.raises(ConfigError, match="parallelism.cp=3 is invalid: 2 x cp x tp must divide"):
        ParallelDims(1, 1, 1, 1, 3, cp=3).validate(ModelConfig(seq_len=64))
    with pytest.raises(ConfigError, match="x cp=2 x tp=1 = 2 ranks does not match the 4 ranks"):
        ParallelDims(1, 1, 1, 1, 4, cp=2).validate(ModelConfig())
    mp.start_processes(
        _cp_world, args=(2, f"file://{tmp_path}/store", str(tmp_path)), nprocs=2, start_method="spawn"
    )
    for rank in (0, 1):
        text = (tmp_path / f"rank{rank}.txt").read_text().splitlines()
        assert text[0] == "dp 1 fsdp ('dp_shard_cp',) 2"
        # Load-balanced: 4 chunks of 4 tokens; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
        chunks = [[0, 1, 2, 3, 12, 13, 14, 15], [4, 5, 6, 7, 8, 9, 10, 11]][rank]
        xs = [[t + 16 * b for t in chunks] for b in (0, 1)]
        ys = [[t + 100 for t in row] for row in xs]
        assert text[1] == f"x {xs} y {ys} rope {[float(t) for t in chunks]}", text
        # Why cp needs GPU ranks (launcher/plan/cpcheck.py): no ring kernel for CPU SDPA.
        assert "_scaled_dot_product_flash_attention_for_cpu" in text[2], text
        assert text[3] == "restored rope 16 x 16"
