"""Numerical proof of the parallel layouts: each layout trains the same
model, seed and data for a few optimizer steps through the launcher's own
local path (``launcher.run.local.run_local`` -> ``python -m train``), and its
per-step loss and grad norm are compared with a single-process run.

Used by scripts/verify_parallel.py, tests/local/test_train_parallel.py and
tests/local/test_train_gpu.py (a harness: not part of the runtime packages).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from launcher.config.schema import ModelConfig, RunConfig
from launcher.config.spec import RunSpec, save_spec
from launcher.plan.make import make_plan

LAYOUT_TIMEOUT_S = 600  # one layout on 2 loaded cores takes < 60 s; a hang fails the row
TOL = {"fp32": 1e-5, "bf16": 2e-3, "compiled": 1e-4}
STEPS = 5


def verify_model() -> ModelConfig:
    """Small, but every degree used below divides its heads, kv heads,
    ffn, vocab and sequence (tp 4), and its layers (pp 2 x 2 stages)."""
    return ModelConfig(
        name="verify", dim=128, n_layers=4, n_heads=8, n_kv_heads=4, ffn_dim=256, vocab_size=256, seq_len=64
    )


@dataclass
class Layout:
    name: str
    ranks: int
    dp_replicate: int = 1
    dp_shard: int = 0
    tp: int = 1
    pp: int = 1
    cp: int = 1  # context parallel (GPU ranks only: train/parallel/cp.py)
    pp_schedule: str = "1f1b"
    stages_per_rank: int = 1
    precision: str = "fp32"
    compile: bool = False
    ac: str = "none"
    quick: bool = False
    gpus: int = 0  # > 0: run on this many local GPUs (NCCL) instead of CPU ranks

    @property
    def kind(self) -> str:
        return "compiled" if self.compile else ("bf16" if self.precision == "bf16" else "fp32")

    def config(self) -> RunConfig:
        cfg = RunConfig(model=verify_model())
        cfg.cluster.local_processes = self.ranks
        if self.gpus:
            assert self.gpus == self.ranks, (self.gpus, self.ranks)
            cfg.cluster.gpus_per_node, cfg.cluster.gpu_type, cfg.cluster.gpu_mem_gb = self.gpus, "cuda", 16.0
        p = cfg.parallelism
        # An explicit mode is kept or refused by the planner, so name the one the degrees mean.
        p.mode = "fsdp_tp_pp" if self.pp > 1 else ("fsdp_tp" if self.tp > 1 else "fsdp")
        if p.mode == "fsdp" and self.dp_replicate > 1:
            p.mode = "hsdp"
        p.dp_replicate, p.tp, p.pp, p.cp = self.dp_replicate, self.tp, self.pp, self.cp
        p.dp_shard = self.dp_shard or self.ranks // (self.dp_replicate * self.tp * self.pp * self.cp)
        p.pp_schedule, p.stages_per_rank = self.pp_schedule, self.stages_per_rank
        p.precision, p.compile, p.activation_checkpointing = self.precision, self.compile, self.ac
        t = cfg.train
        t.steps, t.global_batch_size, t.log_every_steps, t.warmup_steps = STEPS, 8, 1, 2
        cfg.storage.save_every_steps = 1000
        t.checkpoint_at_end = False  # steps are compared, not checkpoints
        return cfg


# The matrix. quick=True: the --quick / CI subset.
LAYOUTS = [
    Layout("fsdp4", 4, quick=True),
    Layout("hsdp2x2", 4, dp_replicate=2, dp_shard=2, quick=True),
    Layout("dp2_tp2_sp", 4, tp=2, quick=True),
    Layout("tp4_sp", 4, tp=4),
    Layout("pp2_1f1b", 2, pp=2, quick=True),
    Layout("pp2_gpipe", 2, pp=2, pp_schedule="gpipe"),
    Layout("pp2_interleaved", 2, pp=2, pp_schedule="interleaved_1f1b", stages_per_rank=2, quick=True),
    Layout("pp2_zbv", 2, pp=2, pp_schedule="zbv", stages_per_rank=2),
    Layout("pp2_dp2", 4, pp=2),
    Layout("pp2_dp2_tp2", 8, pp=2, tp=2),
    Layout("fsdp2_ac_full", 2, ac="full"),
    Layout("fsdp2_ac_selective", 2, ac="selective"),
    Layout("fsdp4_bf16", 4, precision="bf16", quick=True),
    Layout("dp2_tp2_bf16", 4, tp=2, precision="bf16"),
    Layout("fsdp2_compiled", 2, compile=True),
    Layout("dp2_tp2_compiled", 4, tp=2, compile=True),
    Layout("tp2_compiled", 2, tp=2, compile=True),
    Layout("dp2_tp2_sac_compiled", 4, tp=2, ac="selective", compile=True),
]
REFERENCE = Layout("single", 1)
# bf16 layouts are compared with a single-process bf16 run (same mixed
# precision numerics, so the check isolates the layout); the fp32 vs bf16
# single-process gap is printed for information.
REFERENCE_BF16 = Layout("single_bf16", 1, precision="bf16")


@dataclass
class Outcome:
    layout: Layout
    losses: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    step_time_s: float = 0.0
    wall_s: float = 0.0
    error: str = ""
    loss_diff: float = float("nan")
    grad_norm_diff: float = float("nan")

    @property
    def tol(self) -> float:
        return TOL[self.layout.kind]

    @property
    def passed(self) -> bool:
        return not self.error and self.loss_diff <= self.tol and self.grad_norm_diff <= self.tol


def run_layout(layout: Layout, work_dir: str | None = None) -> Outcome:
    from launcher.run.local import run_local

    out = Outcome(layout)
    run_dir = Path(tempfile.mkdtemp(prefix=f"verify-{layout.name}-", dir=work_dir))
    try:
        cfg = layout.config()
        spec = RunSpec(cfg=cfg, plan=make_plan(cfg), run_dir=str(run_dir))
    except ValueError as e:
        out.error = f"plan: {e}"
        return out
    save_spec(spec)
    t0 = time.perf_counter()
    code = run_local(spec, echo=None, timeout_s=LAYOUT_TIMEOUT_S)
    out.wall_s = time.perf_counter() - t0
    if code:
        log = (run_dir / "logs" / "rank0.log").read_text().strip().splitlines()
        errors = [line for line in log if "Error" in line] or log[-1:]
        out.error = f"exit {code}: {errors[-1] if errors else ''}"[:300]
        return out
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in recs if "event" not in r]
    out.losses = [r["loss"] for r in steps]
    out.grad_norms = [r["grad_norm"] for r in steps]
    # Step 1 includes warm-up (first collectives, compilation).
    out.step_time_s = statistics.median(r["step_time_s"] for r in steps[1:]) if len(steps) > 1 else 0.0
    return out


def compare(out: Outcome, ref: Outcome) -> None:
    if out.error:
        return
    if len(out.losses) != len(ref.losses):
        out.error = f"{len(out.losses)} steps logged, reference {len(ref.losses)}"
        return
    out.loss_diff = max(abs(a - b) for a, b in zip(out.losses, ref.losses, strict=True))
    out.grad_norm_diff = max(abs(a - b) for a, b in zip(out.grad_norms, ref.grad_norms, strict=True))


def format_row(o: Outcome) -> str:
    lay = o.layout
    status = "PASS" if o.passed else "FAIL"
    if o.error:
        return f"{lay.name:<20} {lay.ranks:>5}  {status}  {o.error}"
    return (
        f"{lay.name:<20} {lay.ranks:>5}  {status}  {o.loss_diff:>11.2e} {o.grad_norm_diff:>11.2e} "
        f"{o.tol:>8.0e} {o.step_time_s * 1e3:>9.0f} {o.wall_s:>7.1f}"
    )


HEADER = (
    f"{'layout':<20} {'ranks':>5}  {'':4}  {'|loss diff|':>11} {'|gnorm diff|':>11} {'tol':>8} "
    f"{'step ms':>9} {'wall s':>7}"
)
