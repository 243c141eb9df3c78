"""Checks of the performance model against measurements it was not fitted
to (docs/perf-validation.md is written from :func:`report`).

Two kinds of rows, each split into a calibration set (what
``launcher.perf.fit`` fits the constants to) and a held-out set (only
predicted), by source, not by toggles of one configuration:

- published figures: torchtitan's (one source, one cluster) calibrate the
  GPU constants; llm-foundry's, Megatron-LM's and the seed article's are
  held out. One row per independent measurement (a throughput and the MFU
  derived from it are one row).
- CPU runs measured on this host with the real trainer
  (launcher/perf/cpu_runs.yaml, scripts/measure_cpu_runs.py): half
  calibrate the CPU constants, the other half is held out.

Every prediction uses the same calibration file; a case describes the run
(model, GPUs, fabric, batch, checkpointing, compile), never tunes it. What a
published run did that meshrun's trainer does not (float8 GEMMs, another
selective-checkpointing policy) is stated once for its source.

    python -m launcher.plan.validation           # both sets' errors
    python -m launcher.plan.validation --fit     # refit, write conf/perf/default.yaml
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
from dataclasses import dataclass, field
from typing import Any

from launcher.config.compose import compose
from launcher.perf.fit import Measured, cpu_params, fit
from launcher.perf.model import Prediction, predict
from launcher.perf.params import DEFAULT_PATH, PerfParams, load_params, update_file
from launcher.plan.make import make_plan

TT = "torchtitan docs/performance.md (Grand Teton: H100 96GB HBM2e, 500 W cap, 400 Gb/s RDMA per GPU)"
LF = "llm-foundry scripts/train/benchmarking/README.md (H100 80GB, bf16, FSDP FULL_SHARD)"
MEG = "Megatron-LM README (2B-462B GPT, seq 4096, vocab 131072, up to 6144 H100)"
SEED = "seed article (/work/shared/seed/gpu-cluster-config-2026.txt)"
CALIBRATION, HELD_OUT = "calibration", "held_out"

# What the GPU calibration fits: the Hopper matmul efficiency (one value for
# H100, H100-96GB and H200). Only one constant: every torchtitan row has the
# same micro-batch shape (2 x 8192 tokens), so a fixed cost per block cannot
# be told apart from the efficiency (fitting both drives the efficiency to
# its bound of 1 and the per-block cost to 37 ms); block_overhead_s stays 0.
GPU_FIT = ["gpus.H100.matmul_efficiency|gpus.H100-96GB.matmul_efficiency|gpus.H200.matmul_efficiency"]

# torchtitan: the H100s run at 500 W with a peak "between SXM and NVL"; the
# NVL figure (835) is used because the cap throttles sustained GEMM clocks.
GRAND_TETON = [
    "cluster=1node",
    "cluster.gpu_type=H100-96GB-HBM2e",
    "cluster.gpu_mem_gb=96",
    "cluster.gpu_peak_bf16_tflops=835",
    "cluster.fabric=roce_v2",
    "cluster.fabric_adapters_per_node=8",
    "cluster.fabric_adapter_gbit_per_s=400",
]
NDR = ["cluster.fabric=ib_ndr", "cluster.fabric_adapter_gbit_per_s=400"]
# MPT shapes (GELU MLP of 4 x d) as SwiGLU with the same parameter count.
MPT_13B = ["model=13b", "model.seq_len=2048", "model.vocab_size=50368", "model.ffn_dim=13653"]
MPT_70B = [
    "model=70b",
    "model.seq_len=2048",
    "model.vocab_size=50368",
    "model.n_kv_heads=64",
    "model.ffn_dim=21845",
]
BLOOM_7B = [
    "model=7b",
    "model.n_layers=30",
    "model.vocab_size=250880",
    "model.seq_len=2048",
    "model.ffn_dim=10923",
]
NO_CKPT = ["storage.save_every_steps=1000000"]
# torchtitan's runs, stated once for the source: its op-level selective
# checkpointing recomputes every other matmul (meshrun's keeps them all).
TT_SAC = {"selective_matmul_recompute": 0.5}


@dataclass
class Case:
    name: str
    source: str
    split: str  # calibration | held_out
    published: float
    unit: str  # "tok/s/GPU", "MFU", "ratio", "share"
    overrides: list[str]
    # How the published run differs from meshrun's trainer (predict kwargs).
    run: dict[str, Any] = field(default_factory=dict)
    # Ratio rows: the run the first is compared with.
    versus: list[str] = field(default_factory=list)
    note: str = ""


@functools.lru_cache(maxsize=128)
def _planned(overrides: tuple[str, ...]):
    cfg = compose(list(overrides) + NO_CKPT)
    return cfg, make_plan(cfg)


def _run(overrides: list[str], p: PerfParams, **kw: Any) -> Prediction:
    cfg, plan = _planned(tuple(overrides))
    return predict(cfg, plan, p, **kw)


def predicted(c: Case, p: PerfParams) -> float:
    pr = _run(c.overrides, p, **c.run)
    if c.unit == "tok/s/GPU":
        return pr.tokens_per_s_per_gpu
    if c.unit == "MFU":
        return pr.mfu
    if c.unit == "ratio":
        return pr.tokens_per_s / _run(c.versus, p).tokens_per_s
    if c.unit == "share":
        b = pr.breakdown
        return (b["fsdp"] + b["hsdp"] + b["tp"] + b["pp_p2p"]) / pr.step_time_s
    raise AssertionError(c.unit)


def as_measured(c: Case) -> Measured | None:
    """A throughput or MFU row as a measured step time (what the fit uses)."""
    if c.unit not in ("tok/s/GPU", "MFU"):
        return None
    cfg, plan = _planned(tuple(c.overrides))
    tps_gpu = c.published
    if c.unit == "MFU":
        tps_gpu = c.published * plan.gpu_peak_bf16_tflops * 1e12 / plan.flops_per_token
    step = plan.tokens_per_step / (tps_gpu * plan.world_size)
    return Measured(c.name.strip(), cfg, plan, step, 1, dict(c.run))


def _tt8b(nodes: int, compile_: bool) -> list[str]:
    return GRAND_TETON + [
        f"cluster.nodes={nodes}",
        "model=8b",
        "parallelism=fsdp",
        "parallelism.activation_checkpointing=selective",
        f"train.global_batch_size={2 * 8 * nodes}",
        f"parallelism.compile={str(compile_).lower()}",
    ]


def _seed_speedup(name: str, preset: str, nodes: int, published: float) -> Case:
    # Weak scaling: 16 sequences per node (2 per GPU) at every size.
    return Case(
        name,
        SEED + " cost table",
        HELD_OUT,
        published,
        "ratio",
        [f"cluster={preset}", "model=13b", f"train.global_batch_size={16 * nodes}"],
        versus=["cluster=1node_a100", "model=13b", "train.global_batch_size=16"],
    )


CASES: list[Case] = [
    # ---- calibration: torchtitan (one source, one cluster) ----
    Case(
        "Llama 3.1 8B, 8 H100, FSDP, bs 2x8192, SAC",
        TT + " Table 1",
        CALIBRATION,
        5762,
        "tok/s/GPU",
        _tt8b(1, False),
        TT_SAC,
    ),
    Case("  + torch.compile", TT + " Table 1", CALIBRATION, 6667, "tok/s/GPU", _tt8b(1, True), TT_SAC),
    Case(
        "  + compile + float8",
        TT + " Table 1",
        CALIBRATION,
        8532,
        "tok/s/GPU",
        _tt8b(1, True),
        {**TT_SAC, "float8": True},
    ),
    Case(
        "Llama 3.1 8B, 128 H100, FSDP, SAC",
        TT + " Table 3",
        CALIBRATION,
        5605,
        "tok/s/GPU",
        _tt8b(16, False),
        TT_SAC,
    ),
    Case("  + torch.compile", TT + " Table 3", CALIBRATION, 6514, "tok/s/GPU", _tt8b(16, True), TT_SAC),
    Case(
        "Llama 3.1 70B, 256 H100, FSDP 32 x TP 8, full AC, compile + float8",
        TT + " Table 4",
        CALIBRATION,
        829,
        "tok/s/GPU",
        GRAND_TETON
        + [
            "cluster.nodes=32",
            "model=70b",
            "parallelism=fsdp_tp",
            "parallelism.tp=8",
            "parallelism.dp_shard=32",
            "parallelism.dp_replicate=1",
            "parallelism.activation_checkpointing=full",
            "parallelism.compile=true",
            "train.global_batch_size=512",
        ],
        {"float8": True},
    ),
    # ---- held out: llm-foundry, Megatron-LM, the seed article ----
    Case(
        "MPT 13B, seq 2048, 32 H100, FSDP, no AC (published MFU 39.95% is this same run)",
        LF,
        HELD_OUT,
        4811,
        "tok/s/GPU",
        [
            "cluster=4node",
            *NDR,
            *MPT_13B,
            "parallelism=fsdp",
            "parallelism.activation_checkpointing=none",
            "train.global_batch_size=64",
        ],
    ),
    Case(
        "MPT 70B, seq 2048, 64 H100, FSDP, full AC",
        LF,
        HELD_OUT,
        1039,
        "tok/s/GPU",
        [
            "cluster=8node",
            *NDR,
            *MPT_70B,
            "parallelism=fsdp",
            "parallelism.activation_checkpointing=full",
            "train.global_batch_size=2048",
            "train.micro_batch_size=8",
        ],
    ),
    Case(
        "GPT-3 175B shape, 512 H100, TP 4 x PP 8 (interleaved), seq 4096: MFU",
        MEG + "; upper end of its 41-47% range",
        HELD_OUT,
        0.47,
        "MFU",
        [
            "cluster=8node",
            "cluster.nodes=64",
            *NDR,
            "model=70b",
            "model.dim=12288",
            "model.n_layers=96",
            "model.n_heads=96",
            "model.n_kv_heads=96",
            "model.ffn_dim=32768",
            "model.vocab_size=131072",
            "model.seq_len=4096",
            "parallelism=fsdp_tp_pp",
            "parallelism.tp=4",
            "parallelism.pp=8",
            "parallelism.dp_shard=16",
            "parallelism.dp_replicate=1",
            "parallelism.stages_per_rank=6",
            "parallelism.pp_schedule=interleaved_1f1b",
            "parallelism.pp_microbatches=128",
            "parallelism.activation_checkpointing=selective",
            "parallelism.compile=true",
            "train.global_batch_size=2048",
        ],
        note="Megatron's fused kernels are modelled as torch.compile",
    ),
    Case(
        "8x A100 node vs 2 nodes x 4 A100, BLOOM-7B: single node faster by",
        SEED + " (fabric unstated; AWS p4d-like EFA, 2 x 100 Gb/s per 4-GPU node, assumed)",
        HELD_OUT,
        1.23,
        "ratio",
        ["cluster=1node_a100", *BLOOM_7B, "parallelism=fsdp", "train.global_batch_size=32"],
        versus=[
            "cluster=1node_a100",
            "cluster.nodes=2",
            "cluster.gpus_per_node=4",
            "cluster.fabric=efa",
            "cluster.fabric_adapters_per_node=2",
            "cluster.fabric_adapter_gbit_per_s=100",
            *BLOOM_7B,
            "parallelism=fsdp",
            "train.global_batch_size=32",
        ],
    ),
    _seed_speedup("Effective throughput 8x H100 vs 8x A100 (13B)", "1node", 1, 1.8),
    _seed_speedup("Effective throughput 4x8 H100 vs 8x A100 (13B)", "4node", 4, 6.5),
    _seed_speedup("Effective throughput 8x8 H100 vs 8x A100 (13B)", "8node", 8, 10.0),
    _seed_speedup("Effective throughput 16x8 B200 vs 8x A100 (13B)", "16node_b200", 16, 28.0),
    Case(
        "At 128 GPUs, share of time in all-reduce (13B, 16x8 H100 HDR, HSDP)",
        SEED,
        HELD_OUT,
        0.40,
        "share",
        ["cluster=8node", "cluster.nodes=16", "model=13b", "parallelism=hsdp", "train.global_batch_size=0"],
    ),
]


# ---------------------------------------------------------------- evaluation


@dataclass
class Row:
    name: str
    split: str
    unit: str
    published: float  # published figure or measured step time
    predicted: float
    source: str
    extra: str = ""  # load average of a CPU row

    @property
    def error(self) -> float:
        return self.predicted / self.published - 1


def published_rows(p: PerfParams) -> list[Row]:
    return [
        Row(
            c.name,
            c.split,
            c.unit,
            c.published,
            predicted(c, p),
            c.source + (f"; {c.note}" if c.note else ""),
        )
        for c in CASES
    ]


def cpu_host_params(p: PerfParams) -> PerfParams:
    """``p`` with the CPU peak of the host the CPU rows were measured on (so
    that they predict the same anywhere)."""
    from launcher.perf.cpu_runs import host_peak

    h = host_peak()
    return p.replace(
        cpu_peak_gflops_per_core=h["gflops_per_core"], cpu_peak_bf16_gflops_per_core=h["bf16_gflops_per_core"]
    )


def cpu_measured() -> list[tuple[Measured, str, str]]:
    """(measurement, split, the load it was measured under) of every
    measured CPU row."""
    from launcher.perf.cpu_runs import COMMON, load_runs

    out = []
    for r in load_runs():
        if r.step_time_s <= 0:
            continue
        cfg, plan = _planned(tuple(COMMON + r.overrides))
        load = f"load {min(r.load_avg):.1f}-{max(r.load_avg):.1f}" if r.load_avg else ""
        if r.others_cores is not None:
            load += f", other work {r.others_cores:.2f} cores"
        out.append((Measured(r.name, cfg, plan, r.step_time_s, 1), r.split, load))
    return out


def cpu_rows(p: PerfParams) -> list[Row]:
    from launcher.perf.fit import predicted_step

    hp = cpu_host_params(p)
    return [
        Row(m.run_dir, split, "step s", m.step_time_s, predicted_step(m, hp), "this host", load)
        for m, split, load in cpu_measured()
    ]


def refit(p: PerfParams) -> PerfParams:
    """Fit the GPU constants on the published calibration rows and the CPU
    constants on the calibration CPU runs (``launcher.perf.fit``)."""
    gpu_runs = [m for c in CASES if c.split == CALIBRATION and (m := as_measured(c))]
    p = fit(
        gpu_runs,
        p,
        GPU_FIT,
        label=f"the {len(gpu_runs)} torchtitan calibration rows (launcher/plan/validation.py)",
    )
    cpu_runs = [m for m, split, _ in cpu_measured() if split == CALIBRATION]
    if cpu_runs:
        # The host's probe is used for the fit only: the file keeps its own peaks.
        peaks = {k: getattr(p, k) for k in ("cpu_peak_gflops_per_core", "cpu_peak_bf16_gflops_per_core")}
        label = f"the {len(cpu_runs)} calibration CPU runs of launcher/perf/cpu_runs.yaml"
        p = fit(cpu_runs, cpu_host_params(p), cpu_params(cpu_runs), rounds=8, label=label).replace(**peaks)
    return p


@dataclass
class Choice:
    what: str
    chosen: str
    chosen_s: float
    fastest: str
    fastest_s: float

    @property
    def gap(self) -> float:
        return self.chosen_s / self.fastest_s - 1


def cpu_choices(p: PerfParams) -> list[Choice]:
    """How close the layout the model / planner picks on CPU comes to the
    fastest measured candidate: (1) the planner's own candidates for
    ``parallelism=auto`` (its choice among them, with the model), and (2) the
    model's ranking of every measured layout of the same model and ranks."""
    from launcher.perf.cpu_runs import COMMON, PLANNER_CHECKS

    hp = cpu_host_params(p)
    runs = {m.run_dir: m for m, _, _ in cpu_measured()}
    out = []
    for what, auto_overrides, names in PLANNER_CHECKS:
        cands = [runs[n] for n in names if n in runs]
        if len(cands) < 2:
            continue
        fastest = min(cands, key=lambda m: m.step_time_s)
        if auto_overrides:
            cfg = compose(COMMON + auto_overrides)
            plan = make_plan(cfg, perf_params=hp)
            key = (plan.dp_replicate, plan.dp_shard, plan.tp, plan.pp, plan.activation_checkpointing)
            pick = next(
                m
                for m in cands
                if (
                    m.plan.dp_replicate,
                    m.plan.dp_shard,
                    m.plan.tp,
                    m.plan.pp,
                    m.plan.activation_checkpointing,
                )
                == key
            )
        else:
            pick = min(cands, key=lambda m: predict(m.cfg, m.plan, hp).step_time_s)
        out.append(Choice(what, pick.run_dir, pick.step_time_s, fastest.run_dir, fastest.step_time_s))
    return out


def _fmt(v: float, unit: str) -> str:
    if unit == "tok/s/GPU":
        return f"{v:,.0f}"
    if unit in ("MFU", "share"):
        return f"{v:.1%}"
    if unit == "step s":
        return f"{v:.3f}"
    return f"{v:.2f}x"


def table(rows: list[Row], measured: str = "published") -> str:
    """Markdown table: case, unit, published/measured, predicted, error, source."""
    lines = [
        f"| case | unit | {measured} | predicted | error | source |",
        "| --- | --- | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        src = r.source + (f"; {r.extra}" if r.extra else "")
        lines.append(
            f"| {r.name} | {r.unit} | {_fmt(r.published, r.unit)} | {_fmt(r.predicted, r.unit)} | {r.error:+.0%} | {src} |"
        )
    return "\n".join(lines)


def summary(rows: list[Row]) -> str:
    if not rows:
        return "no rows"
    errs = [abs(r.error) for r in rows]
    within = sum(e <= 0.20 for e in errs)
    return (
        f"{len(rows)} rows, mean |error| {statistics.mean(errs):.0%}, max {max(errs):.0%}, "
        f"{within}/{len(rows)} within 20%"
    )


def report(p: PerfParams) -> str:
    pub, cpu = published_rows(p), cpu_rows(p)
    out = []
    for title, rows, col in (
        (
            "Published figures: calibration set (torchtitan)",
            [r for r in pub if r.split == CALIBRATION],
            "published",
        ),
        (
            "Published figures: held-out set (llm-foundry, Megatron-LM, seed article)",
            [r for r in pub if r.split == HELD_OUT],
            "published",
        ),
        ("CPU runs measured here: calibration set", [r for r in cpu if r.split == CALIBRATION], "measured"),
        ("CPU runs measured here: held-out set", [r for r in cpu if r.split == HELD_OUT], "measured"),
    ):
        out += [f"### {title}", "", summary(rows), "", table(rows, col), ""]
    choices = cpu_choices(p)
    if choices:
        out += ["### Layout choice on CPU (measured step times)", ""]
        out += ["| candidates | picked | its step s | fastest measured | its step s | picked vs fastest |"]
        out += ["| --- | --- | ---: | --- | ---: | ---: |"]
        for c in choices:
            out.append(
                f"| {c.what} | {c.chosen} | {c.chosen_s:.3f} | {c.fastest} | {c.fastest_s:.3f} | {c.gap:+.0%} |"
            )
        out.append("")
    out.append(
        f"Calibration: {p.source}; GPU constants: {p.provenance.get('gpu')}; CPU constants: {p.provenance.get('cpu')}"
    )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m launcher.plan.validation", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--fit", action="store_true", help="refit on the calibration sets and write the file")
    ap.add_argument("--perf", default="", help=f"calibration file (default {DEFAULT_PATH})")
    a = ap.parse_args(argv)
    p = load_params(a.perf or None)
    if a.fit:
        fitted = refit(p)
        cpu_fit = [m for m, split, _ in cpu_measured() if split == CALIBRATION]
        names = GPU_FIT + (cpu_params(cpu_fit) if cpu_fit else [])
        update_file(p.source, fitted, names)
        print(f"wrote {p.source}: " + ", ".join(n.split("|")[0] for n in names))
        p = load_params(a.perf or None)
    print(report(p))
    return 0


if __name__ == "__main__":
    sys.exit(main())
