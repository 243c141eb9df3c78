"""Performance model: message sizes, monotonic behaviour, degenerate cases,
and the published figures of docs/perf-validation.md.

Here: its tests that start no process, no process group and no server
(tier unit); the rest: tests/local/test_perf_model.py."""

from __future__ import annotations

import pytest

from launcher.config.compose import compose
from launcher.config.validate import ConfigError
from launcher.perf import comm, load_params, predict
from launcher.perf.flops import param_counts
from launcher.perf.params import params_from_dict
from launcher.plan.make import make_plan

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


def test_published_rows_split_by_source_one_row_per_measurement():
    """docs/perf-validation.md: torchtitan calibrates, the other sources are
    held out; the published (non-seed) rows of both sets are within 20%."""
    from launcher.plan import validation as V

    rows = V.published_rows(P)
    assert {r.split for r in rows if "torchtitan" in r.source} == {V.CALIBRATION}
    assert {r.split for r in rows if "torchtitan" not in r.source} == {V.HELD_OUT}
    # One row per measurement: no two rows describe the same run.
    keys = [(tuple(c.overrides), tuple(sorted(c.run.items())), tuple(c.versus)) for c in V.CASES]
    assert len(set(keys)) == len(keys)
    published = [r for r in rows if "seed" not in r.source]
    assert len([r for r in published if r.split == V.HELD_OUT]) >= 3
    misses = [(r.name, round(r.error, 3)) for r in published if abs(r.error) > 0.20]
    assert not misses, misses


def test_the_file_holds_what_the_calibration_sets_fit():
    """conf/perf/default.yaml is the one source: refitting on the
    calibration sets alone gives back its fitted values."""
    from launcher.perf.calibrate import CPU_PARAMS, _get
    from launcher.plan import validation as V

    assert P.provenance["gpu"].startswith("fit: ") and P.provenance["cpu"].startswith("fit: ")
    # Every CPU constant, bf16's efficiency included, is fitted on rows of its own.
    assert all(n in P.provenance["cpu"] for n in CPU_PARAMS), P.provenance["cpu"]
    refit = V.refit(P)
    for name in V.GPU_FIT + list(CPU_PARAMS):
        assert _get(refit, name) == pytest.approx(_get(P, name), rel=0.03), name


def test_code_holds_no_second_set_of_defaults():
    import dataclasses

    from launcher.perf.params import FILE_KEYS, PerfParams

    fields = {f.name: f for f in dataclasses.fields(PerfParams)}
    defaulted = [
        n
        for n in FILE_KEYS
        if fields[n].default is not dataclasses.MISSING
        or fields[n].default_factory is not dataclasses.MISSING
    ]
    assert defaulted == []
    d = P.to_dict()
    d.pop("cpu_matmul_efficiency")
    with pytest.raises(ConfigError, match="missing key.*cpu_matmul_efficiency"):
        params_from_dict(d)
    assert load_params() is load_params()  # read once


def test_cpu_mfu_from_the_measured_peak_never_above_one(tmp_path, monkeypatch):
    """The CPU peak is the host's probe (here a cached figure): MFU stays a
    share of it, and the prediction says where its constants came from."""
    import json

    from launcher.perf import cpu_peak

    cache = tmp_path / "cpu_peak.json"
    entry = {
        "gflops_per_core": 40.0,
        "bf16_gflops_per_core": 160.0,
        "how": "test probe",
        "probe": cpu_peak.PROBE_VERSION,
    }
    cache.write_text(json.dumps({cpu_peak.host_key(): entry}))
    monkeypatch.setattr(cpu_peak, "CACHE", cache)
    for ov in (
        ["model=tiny"],
        ["model=tiny", "cluster.local_processes=4", "parallelism.activation_checkpointing=full"],
        ["model=tiny", "parallelism.precision=bf16", "model.seq_len=1024"],
        ["model=125m", "cluster.local_processes=1", "train.global_batch_size=1", "model.seq_len=128"],
    ):
        cfg, plan, pred = _predict(["cluster=local", *ov])
        cores = cpu_peak.host_cores()
        per_core = 160.0 if plan.precision == "bf16" else 40.0
        assert pred.peak_tflops == pytest.approx(per_core * cores / plan.ranks_per_node / 1e3)
        assert 0 < pred.mfu <= pred.hfu <= 1, (ov, pred.mfu, pred.hfu)
        assert "test probe" in pred.device_source and "measured on" in pred.device_source
    gpu = _predict(["cluster=1node", "model=8b", "train.global_batch_size=8"])[2]
    assert "cluster.gpu_peak_bf16_tflops" in gpu.device_source


def test_plan_reasons_name_what_decided():
    cfg = compose(["cluster=local", "model=tiny", "parallelism.activation_checkpointing=auto"])
    plan = make_plan(cfg)
    text = " ".join(plan.reasons)
    if plan.activation_checkpointing == "none":
        assert "least recompute that fits" in text and "no other fitting layout is" in text
    else:
        assert "chosen by the performance model" in text and "least recompute" not in text.split(";")[0]
