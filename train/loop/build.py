"""Assemble a trainer from a RunSpec: mesh, model (sharded, then
materialized), pipeline schedule, optimizers, LR schedules, data loader."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from launcher.config.spec import RunSpec
from train.loop.optim import build_optimizers, build_schedulers
from train.models.llama import build_meta_model, materialize_and_init
from train.parallel.dist import DistInfo
from train.parallel.mesh import ParallelDims
from train.parallel.parallelize import parallelize


@dataclass
class Trainer:
    spec: RunSpec
    info: DistInfo
    dims: ParallelDims
    mesh: object
    parts: list[nn.Module]  # one model, or this rank's pipeline stages
    optims: list[torch.optim.Optimizer]
    schedulers: list
    loader: object
    schedule: object | None = None  # pipeline schedule when pp > 1
    has_first_stage: bool = True
    has_last_stage: bool = True
    params: list[torch.Tensor] = field(default_factory=list)
    # train.float8 with FSDP2's float8 all-gather: scales precomputed after
    # each optimizer step (train/parallel/float8.py).
    float8_precompute: bool = False
    float8_note: str = ""  # the run log's line about float8 ("" when off)

    @property
    def device(self) -> torch.device:
        return torch.device(self.info.device)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))


def build_loader(spec: RunSpec, info: DistInfo):
    if spec.cfg.data.kind == "synthetic":
        from train.loop.synthetic import SyntheticLoader

        return SyntheticLoader(spec, info)
    from train.data import build_loader as build_data_loader  # owner: data

    return build_data_loader(spec, info)


def build_trainer(spec: RunSpec, info: DistInfo, dims: ParallelDims) -> Trainer:
    plan, m = spec.plan, spec.cfg.model
    device = torch.device(info.device)
    float8 = spec.cfg.train.float8 if spec.cfg.job.kind in ("pretrain", "finetune") else "off"
    mesh, dp_mesh = dims.build_mesh(device.type)
    info.dp_rank, info.dp_size = dp_mesh.get_local_rank(), dp_mesh.size()
    whole = build_meta_model(m)
    schedule, first, last = None, True, True
    if dims.pp == 1:
        fsdp = parallelize(whole, mesh, dims, plan, float8=float8)
        materialize_and_init(whole, m, spec.cfg.train.seed, device)
        parts = [whole]
    else:
        from train.parallel.pipestages import build_schedule, split_stage, stage_ids_for_rank

        n_stages = dims.pp * plan.stages_per_rank
        pp_rank = mesh["pp"].get_local_rank()
        ids = stage_ids_for_rank(pp_rank, dims.pp, plan.stages_per_rank, plan.pp_schedule)
        parts = []
        for sid in ids:
            part = split_stage(whole, sid, n_stages)
            # Microbatches re-use the gathered params: resharding after each
            # forward would all-gather once per microbatch, and the
            # zero-bubble schedule gets wrong gradients with it (measured).
            fsdp = parallelize(part, mesh, dims, plan, reshard_after_forward=False, float8=float8)
            materialize_and_init(part, m, spec.cfg.train.seed, device)
            parts.append(part)
        first, last = 0 in ids, (n_stages - 1) in ids
        schedule = build_schedule(
            list(zip(ids, parts, strict=True)),
            n_stages,
            plan.pp_schedule,
            plan.pp_microbatches,
            device,
            mesh["pp"].get_group(),
            loss_fn,
        )
    if spec.cfg.job.hf_path or spec.cfg.job.checkpoint:
        from train.loop.weights import load_job_weights

        load_job_weights(parts, spec)  # over the random init; a resume overrides both
    # TP-only layouts (no FSDP) can mix DTensor and plain parameters on a
    # stage; foreach AdamW cannot, so use the per-tensor path there.
    foreach = None if (fsdp or dims.tp == 1) else False
    optims = build_optimizers(parts, spec.cfg.train, foreach=foreach)
    note = ""
    if float8 != "off":
        from train.parallel.float8 import describe

        note = describe(parts, float8, device)
    return Trainer(
        spec=spec,
        info=info,
        dims=dims,
        mesh=mesh,
        parts=parts,
        optims=optims,
        schedulers=build_schedulers(optims, spec.cfg.train),
        loader=build_loader(spec, info),
        schedule=schedule,
        has_first_stage=first,
        has_last_stage=last,
        params=[p for part in parts for p in part.parameters()],
        float8_precompute=float8 == "tensorwise" and fsdp,
        float8_note=note,
    )
