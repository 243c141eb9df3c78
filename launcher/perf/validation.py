"""Published figures the performance model is checked against
(docs/perf-validation.md is generated from :func:`table`).

Each case describes the published run (model shape, GPUs, fabric, batch,
activation checkpointing, compile, float8) with meshrun overrides; no case
carries its own tuning: every prediction uses the same calibration file.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from launcher.compose import compose
from launcher.perf.model import Prediction, predict
from launcher.perf.params import PerfParams, load_params
from launcher.plan import make_plan

TT = "torchtitan docs/performance.md (Grand Teton: H100 96GB HBM2e, 500 W cap, 400 Gb/s RDMA per GPU)"
LF = "llm-foundry scripts/train/benchmarking/README.md (H100 80GB, bf16, FSDP FULL_SHARD)"
MEG = "Megatron-LM README (2B-462B GPT, seq 4096, vocab 131072, up to 6144 H100)"
SEED = "seed article (/work/shared/seed/gpu-cluster-config-2026.txt)"

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
MPT_7B = ["model=7b", "model.seq_len=2048", "model.vocab_size=50368", "model.ffn_dim=10923"]
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
TT_SAC = 0.5  # torchtitan's op-level SAC recomputes every other matmul


@dataclass
class Case:
    name: str
    source: str
    published: float
    unit: str  # "tok/s/GPU", "MFU", "ratio", "share"
    predict: Callable[[PerfParams], float]
    note: str = ""


@functools.lru_cache(maxsize=64)
def _planned(overrides: tuple[str, ...]):
    cfg = compose(list(overrides) + NO_CKPT)
    return cfg, make_plan(cfg)


def _run(overrides: list[str], p: PerfParams, **kw) -> Prediction:
    cfg, plan = _planned(tuple(overrides))
    return predict(cfg, plan, p, **kw)


def _tps(overrides: list[str], **kw) -> Callable[[PerfParams], float]:
    return lambda p: _run(overrides, p, **kw).tokens_per_s_per_gpu


def _mfu(overrides: list[str], **kw) -> Callable[[PerfParams], float]:
    return lambda p: _run(overrides, p, **kw).mfu


def _ratio(a: list[str], b: list[str]) -> Callable[[PerfParams], float]:
    return lambda p: _run(a, p).tokens_per_s / _run(b, p).tokens_per_s


def _tt8b(nodes: int, compile_: bool, float8: bool = False) -> Callable[[PerfParams], float]:
    ov = GRAND_TETON + [
        f"cluster.nodes={nodes}",
        "model=8b",
        "parallelism=fsdp",
        "parallelism.activation_checkpointing=selective",
        f"train.global_batch_size={2 * 8 * nodes}",
        f"parallelism.compile={str(compile_).lower()}",
    ]
    return _tps(ov, float8=float8, selective_matmul_recompute=TT_SAC)


def _seed_speedup(preset: str, nodes: int) -> Callable[[PerfParams], float]:
    # Weak scaling: 16 sequences per node (2 per GPU) at every size.
    return _ratio(
        [f"cluster={preset}", "model=13b", f"train.global_batch_size={16 * nodes}"],
        ["cluster=1node_a100", "model=13b", "train.global_batch_size=16"],
    )


def _exposed_comm_share(overrides: list[str]) -> Callable[[PerfParams], float]:
    def f(p: PerfParams) -> float:
        pr = _run(overrides, p)
        b = pr.breakdown
        return (b["fsdp"] + b["hsdp"] + b["tp"] + b["pp_p2p"]) / pr.step_time_s

    return f


CASES: list[Case] = [
    Case("Llama 3.1 8B, 8 H100, FSDP, bs 2x8192, SAC", TT + " Table 1", 5762, "tok/s/GPU", _tt8b(1, False)),
    Case("  + torch.compile", TT + " Table 1", 6667, "tok/s/GPU", _tt8b(1, True)),
    Case("  + compile + float8", TT + " Table 1", 8532, "tok/s/GPU", _tt8b(1, True, True)),
    Case("Llama 3.1 8B, 128 H100, FSDP, SAC", TT + " Table 3", 5605, "tok/s/GPU", _tt8b(16, False)),
    Case("  + torch.compile", TT + " Table 3", 6514, "tok/s/GPU", _tt8b(16, True)),
    Case(
        "Llama 3.1 70B, 256 H100, FSDP 32 x TP 8, full AC, compile + float8",
        TT + " Table 4",
        829,
        "tok/s/GPU",
        _tps(
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
            float8=True,
        ),
    ),
    Case(
        "MPT 13B, seq 2048, 32 H100, FSDP, no AC",
        LF,
        4811,
        "tok/s/GPU",
        _tps(
            [
                "cluster=4node",
                *NDR,
                *MPT_13B,
                "parallelism=fsdp",
                "parallelism.activation_checkpointing=none",
                "train.global_batch_size=64",
            ]
        ),
    ),
    Case(
        "MPT 13B, 32 H100: MFU",
        LF,
        0.3995,
        "MFU",
        _mfu(
            [
                "cluster=4node",
                *NDR,
                *MPT_13B,
                "parallelism=fsdp",
                "parallelism.activation_checkpointing=none",
                "train.global_batch_size=64",
            ]
        ),
    ),
    Case(
        "MPT 7B, seq 2048, 8 H100, FSDP, no AC",
        LF,
        10643,
        "tok/s/GPU",
        # The planner's activation estimate is conservative here (the
        # published run fits in 80 GB); capacity raised so it plans.
        _tps(
            [
                "cluster=1node",
                "cluster.gpu_mem_gb=100",
                *MPT_7B,
                "parallelism=fsdp",
                "parallelism.activation_checkpointing=none",
                "train.global_batch_size=48",
            ]
        ),
    ),
    Case(
        "MPT 70B, seq 2048, 64 H100, FSDP, full AC",
        LF,
        1039,
        "tok/s/GPU",
        _tps(
            [
                "cluster=8node",
                *NDR,
                *MPT_70B,
                "parallelism=fsdp",
                "parallelism.activation_checkpointing=full",
                "train.global_batch_size=2048",
                "train.micro_batch_size=8",
            ]
        ),
    ),
    Case(
        "GPT-3 175B shape, 512 H100, TP 4 x PP 8 (interleaved), seq 4096: MFU",
        MEG + "; upper end of its 41-47% range",
        0.47,
        "MFU",
        _mfu(
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
            ]
        ),
        note="Megatron's fused kernels are modelled as torch.compile",
    ),
    Case(
        "8x A100 node vs 2 nodes x 4 A100, BLOOM-7B: single node faster by",
        SEED + " (fabric unstated; AWS p4d-like EFA, 2 x 100 Gb/s per 4-GPU node, assumed)",
        1.23,
        "ratio",
        _ratio(
            ["cluster=1node_a100", *BLOOM_7B, "parallelism=fsdp", "train.global_batch_size=32"],
            [
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
    ),
    Case(
        "Effective throughput 8x H100 vs 8x A100 (13B)",
        SEED + " cost table",
        1.8,
        "ratio",
        _seed_speedup("1node", 1),
    ),
    Case(
        "Effective throughput 4x8 H100 vs 8x A100 (13B)",
        SEED + " cost table",
        6.5,
        "ratio",
        _seed_speedup("4node", 4),
    ),
    Case(
        "Effective throughput 8x8 H100 vs 8x A100 (13B)",
        SEED + " cost table",
        10.0,
        "ratio",
        _seed_speedup("8node", 8),
    ),
    Case(
        "Effective throughput 16x8 B200 vs 8x A100 (13B)",
        SEED + " cost table",
        28.0,
        "ratio",
        _seed_speedup("16node_b200", 16),
    ),
    Case(
        "At 128 GPUs, share of time in all-reduce (13B, 16x8 H100 HDR, HSDP)",
        SEED,
        0.40,
        "share",
        _exposed_comm_share(
            [
                "cluster=8node",
                "cluster.nodes=16",
                "model=13b",
                "parallelism=hsdp",
                "train.global_batch_size=0",
            ]
        ),
    ),
]


@dataclass
class Row:
    case: Case
    predicted: float

    @property
    def error(self) -> float:
        return self.predicted / self.case.published - 1


def evaluate(params: PerfParams | None = None) -> list[Row]:
    p = params or load_params()
    return [Row(c, c.predict(p)) for c in CASES]


def _fmt(v: float, unit: str) -> str:
    if unit == "tok/s/GPU":
        return f"{v:,.0f}"
    if unit in ("MFU", "share"):
        return f"{v:.1%}"
    return f"{v:.2f}x"


def table(rows: list[Row]) -> str:
    """Markdown table: case, published, predicted, error, source."""
    lines = [
        "| case | unit | published | predicted | error | source |",
        "| --- | --- | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        c = r.case
        src = c.source + (f"; {c.note}" if c.note else "")
        lines.append(
            f"| {c.name} | {c.unit} | {_fmt(c.published, c.unit)} | {_fmt(r.predicted, c.unit)} | {r.error:+.0%} | {src} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(evaluate()))
