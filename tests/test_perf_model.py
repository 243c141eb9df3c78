"""Performance model: message sizes, monotonic behaviour, degenerate cases,
and the published figures of docs/perf-validation.md."""

from __future__ import annotations

import subprocess
import sys

import pytest

from launcher.compose import compose
from launcher.flops import param_counts
from launcher.perf import comm, load_params, predict
from launcher.perf.params import params_from_dict
from launcher.plan import make_plan
from launcher.validate import ConfigError

P = load_params()


def _predict(overrides, params=P, **kw):
    cfg = compose(overrides)
    plan = make_plan(cfg)
    return cfg, plan, predict(cfg, plan, params, **kw)


def _coll(pred, dim, op):
    return next(c for c in pred.collectives if c.dim == dim and c.op == op)


def test_fsdp_message_sizes_8b():
    cfg, plan, pred = _predict(["cluster=1node", "model=8b", "parallelism=fsdp", "train.global_batch_size=8"])
    pc = param_counts(cfg.model)
    full = pc.total  # pp=1: every block, the embedding and the head
    assert _coll(pred, "fsdp", "all_gather").nbytes == pytest.approx(full * 2)  # bf16 params
    assert _coll(pred, "fsdp", "reduce_scatter").nbytes == pytest.approx(full * 4)  # fp32 grads
    assert _coll(pred, "fsdp", "all_gather").calls_per_step == 2 * plan.grad_accum_steps
    assert _coll(pred, "fsdp", "all_gather").link == "nvlink"


def test_tp_and_hsdp_message_sizes():
    cfg, plan, pred = _predict(
        [
            "cluster=4node",
            "model=13b",
            "parallelism=fsdp_tp",
            "parallelism.tp=8",
            "parallelism.dp_replicate=4",
            "parallelism.dp_shard=1",
            "train.global_batch_size=8",
        ]
    )
    m = cfg.model
    tp = _coll(pred, "tp", "all_gather+reduce_scatter")
    assert tp.nbytes == plan.micro_batch_size * m.seq_len * m.dim * 2
    assert tp.group == 8 and tp.link == "nvlink"
    ar = _coll(pred, "hsdp", "all_reduce")
    assert ar.nbytes == pytest.approx(param_counts(m).total / 8 * 4)
    assert ar.group == 4 and ar.link == "ib_hdr"


def test_ring_and_tree_formulas():
    link = comm.Link("x", 100.0, 10e-6)
    assert comm.ring_all_gather(1, 1e9, link) == 0.0
    assert comm.all_reduce(1, 1e9, link) == 0.0
    # 1 GB over 8 ranks at 100 GB/s: 7/8 * 10 ms + 7 latencies.
    assert comm.ring_all_gather(8, 1e9, link) == pytest.approx(7 / 8 * 0.01 + 7 * 10e-6)
    # Large message: ring wins (2(n-1)/n < 2); tiny message on many ranks: tree.
    big, small = 1e10, 1e3
    ring_big = 2 * 7 * link.latency_s + 2 * 7 / 8 * big / 1e11
    assert comm.all_reduce(8, big, link) == pytest.approx(ring_big)
    n = 1024
    assert comm.all_reduce(n, small, link) < 2 * (n - 1) * link.latency_s


def test_fabric_rails():
    c = compose(["cluster=4node"]).cluster  # 8 x 200 Gb/s per node
    one = comm.inter_node_link(c, "cuda", 8, P, 1)
    eight = comm.inter_node_link(c, "cuda", 8, P, 8)
    assert one.gb_per_s == pytest.approx(25 * P.fabric_eff("ib_hdr"))
    assert eight.gb_per_s == pytest.approx(min(8 * one.gb_per_s, comm.intra_node_link(c, "cuda", P).gb_per_s))


@pytest.mark.parametrize(
    "knob", ["cluster.fabric_adapter_gbit_per_s", "cluster.intra_node_bandwidth_gb_per_s"]
)
def test_more_bandwidth_never_slower(knob):
    base = ["cluster=4node", "model=13b", "parallelism=fsdp", "train.global_batch_size=32"]
    steps = [_predict([*base, f"{knob}={bw}"])[2].step_time_s for bw in (50, 200, 800, 1600)]
    assert all(a >= b for a, b in zip(steps, steps[1:], strict=False)), steps
    assert steps[0] > steps[-1]  # and bandwidth matters for this plan


def test_more_microbatches_never_larger_bubble():
    base = [
        "cluster=8node",
        "model=70b",
        "parallelism=fsdp_tp_pp",
        "parallelism.pp=4",
        "parallelism.tp=8",
        "parallelism.pp_schedule=1f1b",
        "parallelism.stages_per_rank=1",
        "train.global_batch_size=64",
    ]
    bubbles = [
        _predict([*base, f"parallelism.pp_microbatches={n}"])[2].breakdown["pp_bubble"] for n in (4, 8, 16)
    ]
    assert all(a > b for a, b in zip(bubbles, bubbles[1:], strict=False)), bubbles
    inter = _predict(
        [
            *base[:-3],
            "parallelism.pp_schedule=interleaved_1f1b",
            "parallelism.stages_per_rank=2",
            "train.global_batch_size=64",
            "parallelism.pp_microbatches=8",
        ]
    )[2]
    plain = _predict([*base, "parallelism.pp_microbatches=8"])[2]
    assert inter.breakdown["pp_bubble"] < plain.breakdown["pp_bubble"]


def test_one_gpu_has_no_communication():
    _, plan, pred = _predict(
        ["cluster=1node", "cluster.gpus_per_node=1", "model=1b", "train.global_batch_size=4"]
    )
    assert plan.world_size == 1
    assert pred.collectives == []
    for k in ("fsdp", "hsdp", "tp", "pp_p2p", "pp_bubble"):
        assert pred.breakdown[k] == 0.0
    assert pred.step_time_s == pytest.approx(sum(pred.breakdown.values()))
    assert 0 < pred.mfu < 1


def test_faster_gpu_and_compile_are_faster():
    base = ["model=8b", "parallelism=fsdp", "train.global_batch_size=8"]
    a100 = _predict(["cluster=1node_a100", *base])[2]
    h100 = _predict(["cluster=1node", *base])[2]
    compiled = _predict(["cluster=1node", *base, "parallelism.compile=true"])[2]
    assert h100.tokens_per_s > 1.5 * a100.tokens_per_s
    assert compiled.step_time_s < h100.step_time_s


def test_bad_params_name_the_key():
    with pytest.raises(ConfigError, match="no_such_knob"):
        params_from_dict({"no_such_knob": 1})


def test_import_is_torch_free():
    code = "import sys, launcher.perf, launcher.predict, launcher.cost; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_published_figures_within_15_percent():
    """docs/perf-validation.md: every published (non-seed) figure within 15%."""
    from launcher.perf.validation import CASES, evaluate

    rows = evaluate(P)
    assert len(rows) == len(CASES)
    published = [r for r in rows if "seed" not in r.case.source]
    assert len(published) >= 10
    misses = [(r.case.name, round(r.error, 3)) for r in published if abs(r.error) > 0.15]
    assert not misses, misses
