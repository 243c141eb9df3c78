"""A run's plan, step by step: check the input, choose the layout, price it,
plan the stop signal, record a CPU rank's peak. :func:`make_plan` runs them
in that order for tools and tests; launcher/run/prepare.py calls each step
itself, so a run's path reads in order."""

from __future__ import annotations

import math
import subprocess
from typing import TYPE_CHECKING

from launcher.config.plandata import PEER_COPIES_KEPT, Plan
from launcher.config.schema import RunConfig
from launcher.config.validate import ConfigError, fail, validate
from launcher.perf.pricing import estimate_cost
from launcher.plan.cpcheck import check_cp
from launcher.plan.forecast import plan_save_interval
from launcher.plan.fp8check import check_float8
from launcher.plan.jobs import check_job
from launcher.plan.planner import check_preset, plan_layout

if TYPE_CHECKING:
    from launcher.perf.params import PerfParams


def check_input(cfg: RunConfig) -> None:
    """Every field (credentials first), the job kind's inputs (model=hf takes
    its shape from config.json), float8's GPU and shapes, an explicit
    parallelism preset and what parallelism.cp composes with."""
    validate(cfg)
    check_job(cfg)
    check_float8(cfg)
    check_preset(cfg)
    check_cp(cfg)


def check_in_process(cfg: RunConfig) -> None:
    """launcher.in_process_recovery, what it supports: meshrun's training
    loop, on this machine or under the Slurm supervisor
    (launcher/selfheal/inprocess.py; the layout: check_in_process_layout)."""
    if not cfg.launcher.in_process_recovery:
        return
    if cfg.job.kind not in ("pretrain", "finetune"):
        raise fail(
            "launcher.in_process_recovery",
            True,
            f"recovers meshrun's training loop only (job.kind={cfg.job.kind}; valid: pretrain, finetune)",
        )


def check_in_process_layout(cfg: RunConfig, plan: Plan) -> None:
    """launcher.in_process_recovery: a layout whose every rank's state is its
    own shards, restored at the same rank (data, tensor and pipeline
    parallel: tests/local/test_inprocess_recovery.py), and a partner for
    every rank (at least 2 ranks)."""
    if not cfg.launcher.in_process_recovery:
        return
    if plan.cp > 1:  # GPU ranks only: never recovered in process here
        raise fail(
            "parallelism.cp",
            plan.cp,
            "launcher.in_process_recovery=true is proven with data, tensor and pipeline parallel layouts, "
            "not context parallel: set parallelism.cp=1 or launcher.in_process_recovery=false",
        )
    if plan.world_size < 2:
        raise fail(
            "launcher.in_process_recovery",
            True,
            f"needs at least 2 ranks, one to hold the other's copy (world size {plan.world_size}): "
            "raise cluster.local_processes",
        )
    check_peer_memory(cfg, plan)


def peer_copy_gb(plan: Plan) -> float:
    """One peer copy of a rank: its model and optimizer shards (the plan's)."""
    return plan.memory.params_gb + plan.memory.optimizer_gb


def check_peer_memory(cfg: RunConfig, plan: Plan) -> None:
    """Every rank keeps PEER_COPIES_KEPT copies of its own shards and as many
    of its partner's in host memory: the node's ranks' copies (and, on CPU
    ranks, their own training memory: host RAM is their device memory) must
    fit in cluster.mem_per_node_gb."""
    copy_gb = peer_copy_gb(plan)
    per_rank = 2 * PEER_COPIES_KEPT * copy_gb
    own = plan.memory.total_gb if plan.device == "cpu" else 0.0
    need = plan.ranks_per_node * (per_rank + own)
    have = cfg.cluster.mem_per_node_gb
    if need <= have:
        return
    fits = int(have // (per_rank + own)) if per_rank + own > 0 else plan.ranks_per_node
    cpu = f" + {own:.2f} GB its own training memory (CPU ranks)" if own else ""
    raise fail(
        "cluster.mem_per_node_gb",
        have,
        f"launcher.in_process_recovery=true keeps {2 * PEER_COPIES_KEPT} copies of each rank's model and "
        f"optimizer shard in host memory (its own newest {PEER_COPIES_KEPT} and its partner's): "
        f"{2 * PEER_COPIES_KEPT} x {copy_gb:.2f} GB a rank{cpu}, {plan.ranks_per_node} ranks a node = "
        f"{need:.1f} GB a node; {have:g} GB holds that for {fits} rank(s) a node. Set "
        f"cluster.mem_per_node_gb >= {math.ceil(need)} (the node's host RAM), shard the model over more "
        "ranks, or launcher.in_process_recovery=false",
    )


def price(cfg: RunConfig, plan: Plan) -> None:
    """GPU-hours x price (None for CPU runs), from the performance model;
    none for a script job (the model knows nothing of its program). Resolves
    storage.save_every_steps=auto first (plan.save_auto)."""
    plan.cost = None if cfg.job.kind == "script" else estimate_cost(cfg, plan)
    # storage.save_every_steps=auto: the interval, then the price with its stall.
    plan_save_interval(cfg, plan)
    if plan.save_auto is not None and plan.cost is not None:
        plan.cost = estimate_cost(cfg, plan)


def plan_stop_lead(cfg: RunConfig, plan: Plan) -> None:
    """Slurm runs: the USR2 lead before the time limit; the final save after
    a signal must fit before Slurm's kill (refused when it cannot). The stop
    vote is read a step after it starts (train/loop/signals.py): one predicted
    step more (from the price; none known: 0)."""
    if cfg.cluster.kind != "slurm":
        return
    from launcher.plan.stopping import plan_signal_lead_s

    tps = plan.cost.tokens_per_s_per_gpu * plan.world_size if plan.cost else 0.0
    step_s = plan.global_batch_size * cfg.model.seq_len / tps if tps > 0 else 0.0
    plan.signal_lead_s, warnings = plan_signal_lead_s(cfg, plan.params, plan.nodes, step_s)
    plan.warnings += warnings


def record_cpu_peak(cfg: RunConfig, plan: Plan) -> None:
    """CPU ranks: the peak the trainer's logged MFU is a share of, the same
    figure the performance model predicts with (the host's cached matmul
    probe at the plan's precision). 0 (no MFU logged) when the probe cannot
    run; the trainer says so."""
    if plan.device != "cpu" or cfg.job.kind == "script":
        return
    from launcher.perf.steptime import cpu_rank_peak

    try:
        plan.cpu_rank_peak_gflops, _ = cpu_rank_peak(cfg, plan)
    except (RuntimeError, OSError, ConfigError, subprocess.SubprocessError):
        plan.cpu_rank_peak_gflops = 0.0


def make_plan(cfg: RunConfig, perf_params: PerfParams | None = None) -> Plan:
    """Check ``cfg`` and return the one Plan everything downstream uses."""
    check_in_process(cfg)  # before the job's own checks: it names what this option supports
    check_input(cfg)
    plan = plan_layout(cfg, perf_params)
    check_in_process_layout(cfg, plan)
    price(cfg, plan)
    plan_stop_lead(cfg, plan)
    record_cpu_peak(cfg, plan)
    return plan
