"""parallelism.cp (context parallel): the layouts it composes with, checked
before anything is written, and the degrees the planner tries.

Rules (each refusal names the field, the value and the choices):
- 2 x cp must divide model.seq_len: torch's load-balanced ring attention
  (its causal head-tail balancer, the default) cuts each sequence into
  2 x cp equal chunks and gives rank r chunks r and 2cp-1-r, so every rank
  does the same causal work; chunks must be whole tokens.
- cp must divide the world (cp x the other degrees = the ranks).
- training only (job=pretrain / finetune): eval and generate run their own
  inference layouts (generate decodes one token at a time: no sequence to
  split), job=script is a team's program.
- a llama decoder: ViT trains with FSDP/HSDP only (as for tp and pp).
- no pipeline (pp <= 1): meshrun opens the context around a micro-batch's
  forward and backward (train/loop/step.py), which a pipeline schedule
  runs inside itself.
- GPU ranks: torch 2.13 implements ring attention for the CUDA SDPA kernels
  only; on CPU ranks SDPA fails inside the context (train/parallel/cp.py).
"""

from __future__ import annotations

from launcher.config.schema import RunConfig
from launcher.config.validate import fail
from launcher.plan.candidates import candidate_tp, ranks_per_node

TRAIN_KINDS = ("pretrain", "finetune")
MAX_AUTO_CP = 16  # the planner's largest choice; a user may set more


def valid_cp(seq_len: int, world: int) -> list[int]:
    """The degrees > 1 that split ``seq_len`` into 2 x cp chunks and divide ``world``."""
    return [c for c in range(2, world + 1) if world % c == 0 and seq_len % (2 * c) == 0]


def check_cp(cfg: RunConfig) -> None:
    """Refuse a parallelism.cp > 1 the run cannot use (the module's rules)."""
    p, m = cfg.parallelism, cfg.model
    cp = p.cp
    if cp <= 1:
        return
    field = "parallelism.cp"
    off = "set parallelism.cp=0 or 1"
    if cfg.job.kind not in TRAIN_KINDS:
        raise fail(field, cp, f"context parallel splits training sequences: job={cfg.job.kind} needs {off}")
    if m.family != "llama":
        raise fail(field, cp, f"model.family={m.family} trains with FSDP/HSDP only: {off}")
    rpn, device = ranks_per_node(cfg)
    if device != "cuda":
        raise fail(
            field,
            cp,
            "ring attention needs GPU ranks (torch's context_parallel has no CPU SDPA kernel): "
            f"{off} on CPU ranks",
        )
    if p.pp > 1:
        raise fail(
            field,
            cp,
            f"context parallel does not compose with pipeline parallel here: {off} or parallelism.pp=0/1",
        )
    world = cfg.cluster.nodes * rpn
    choices = ", ".join(map(str, valid_cp(m.seq_len, world))) or "none (only 1)"
    if m.seq_len % (2 * cp):
        raise fail(
            field,
            cp,
            f"2 x cp must divide model.seq_len={m.seq_len} (load-balanced ring attention: 2 x cp chunks); "
            f"choose from {choices} for {world} ranks",
        )
    if world % cp:
        raise fail(field, cp, f"must divide the {world} ranks; choose from {choices}")


def candidate_cp(cfg: RunConfig, world: int, device: str) -> list[int]:
    """The degrees to try, least splitting first: the planner takes the first
    that fits in memory, so cp > 1 only when cp = 1 does not fit."""
    p, m = cfg.parallelism, cfg.model
    if p.cp:
        return [p.cp]
    if device != "cuda" or cfg.job.kind not in TRAIN_KINDS or m.family != "llama" or p.pp > 1:
        return [1]
    return [1, *(c for c in valid_cp(m.seq_len, world) if c <= MAX_AUTO_CP and c & (c - 1) == 0)]


def cp_tp_pairs(
    cfg: RunConfig, world: int, rpn: int, device: str, mode: str, size: float
) -> list[tuple[int, int]]:
    """(cp, tp) in the planner's order: cp = 1 first with its TP degrees;
    each cp > 1 with TP inside a node as without cp, then a TP of a node's
    ranks / cp (so that cp and tp share a node when the first cannot)."""
    pairs: dict[tuple[int, int], None] = {}
    for cp in candidate_cp(cfg, world, device):
        for ranks in (rpn, max(1, rpn // cp)):
            pairs.update(((cp, tp), None) for tp in candidate_tp(cfg, ranks, mode, size))
    return list(pairs)
