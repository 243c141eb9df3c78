"""job=eval: loss and perplexity of weights on a held-out token set.

The model is built and sharded exactly as for training (any FSDP / TP / PP
layout; under PP the training schedule runs forward only), the data read in file
order (no shuffle) from its start, each batch split into the same
micro-batches the trainer uses, so a checkpoint of step N evaluated on the
batch the trainer saw at step N + 1 gives the loss it logged there.

Weights: every complete checkpoint of a run (``job.checkpoint=<run dir>``,
``job.all_checkpoints=true``), its newest, one ``step_N`` dir, or
``job.hf_path``. Writes ``<run_dir>/eval.json``:
``{"data", "batches", "sequences", "tokens", "results": [{"step",
"checkpoint", "loss", "perplexity"}]}`` (step/checkpoint null for HF
weights), and result.json with the last result's loss.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from launcher.config.runfiles import EVAL_FILE
from launcher.config.spec import RunSpec
from launcher.config.validate import ConfigError
from train.observe.runlog import RunLog
from train.parallel.dist import DistInfo
from train.parallel.mesh import ParallelDims


def eval_batches(spec: RunSpec) -> int:
    """Batches to evaluate: job.eval_batches, or one pass over the data."""
    j, d = spec.cfg.job, spec.cfg.data
    if j.eval_batches:
        return j.eval_batches
    if d.kind == "synthetic":
        raise ConfigError("job.eval_batches=0 is invalid with data=synthetic (it has no end): set a count")
    from launcher.config.datasets import check_data

    n = check_data(spec.cfg) // spec.plan.global_batch_size
    if n == 0:
        raise ConfigError(
            f"data.path={d.path!r}: fewer sequences than one batch of train.global_batch_size="
            f"{spec.plan.global_batch_size}"
        )
    return n


@torch.no_grad()
def mean_loss(t, batches: int) -> tuple[float, int]:
    """(mean token loss over ``batches`` global batches, tokens) for the
    weights now in ``t.parts``; every rank gets the same numbers."""
    accum = t.spec.plan.grad_accum_steps
    total = torch.zeros((), dtype=torch.float64, device=t.device)
    count = 0
    for _ in range(batches):
        inputs, targets = next(t.loader)
        if t.schedule is not None:
            # Pipeline: the training schedule, forward only; its microbatch
            # losses (last stage only) averaged as the trainer logs them.
            losses: list[torch.Tensor] = []
            kw = {"target": targets, "losses": losses} if t.has_last_stage else {}
            if t.has_first_stage:
                t.schedule.eval(inputs, **kw)
            else:
                t.schedule.eval(**kw)
            if t.has_last_stage:
                total += torch.stack([x.detach().double() for x in losses]).mean()
        else:
            # The trainer's micro-batches: its logged loss is the mean of their means.
            for x, y in zip(inputs.chunk(accum), targets.chunk(accum), strict=True):
                logits = t.parts[0](x)
                total += F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(0, 1)).double() / accum
        count += targets.numel()
    dist.all_reduce(total)
    # Only last-stage ranks hold a loss, and the tp peers of a rank the same
    # one: average over dp.
    loss = total.item() / (t.dims.dp * t.dims.tp) / batches
    n = torch.tensor([count], device=t.device)
    dist.all_reduce(n)
    return loss, int(n.item()) // (t.dims.tp * t.dims.pp)


def run_eval(spec: RunSpec, info: DistInfo, dims: ParallelDims, log: RunLog) -> int:
    from train.loop.build import build_trainer
    from train.loop.weights import checkpoint_steps, load_checkpoint_model

    j = spec.cfg.job
    # File order from the first batch: the same sequences for every weight set.
    spec = dataclasses.replace(
        spec, cfg=dataclasses.replace(spec.cfg, data=dataclasses.replace(spec.cfg.data, shuffle=False))
    )
    n_batches = eval_batches(spec)
    t = build_trainer(spec, info, dims)  # loads the newest checkpoint or the HF weights
    start = t.loader.state_dict()
    targets = checkpoint_steps(j.checkpoint, all_steps=j.all_checkpoints) if j.checkpoint else [(None, None)]
    log.print(
        f"eval: {len(targets)} weight set(s) x {n_batches} batches of {spec.plan.global_batch_size} "
        f"sequences on {info.world_size} ranks (mesh {dims.names()})"
    )
    results = []
    for step, step_dir in targets:
        if step_dir is not None and len(targets) > 1:  # build_trainer loaded the only one
            load_checkpoint_model(t.parts, step_dir)
        t.loader.load_state_dict(start)
        loss, tokens = mean_loss(t, n_batches)
        ppl = math.exp(loss) if loss < 700 else float("inf")
        results.append({"step": step, "checkpoint": step_dir, "loss": loss, "perplexity": ppl})
        log.print(
            f"eval: {'step ' + str(step) if step is not None else 'weights'}: loss {loss:.5f}, perplexity {ppl:.3f}"
        )
    doc = {
        "data": spec.cfg.data.path or spec.cfg.data.kind,
        "weights": j.checkpoint or j.hf_path,
        "batches": n_batches,
        "sequences": n_batches * spec.plan.global_batch_size,
        "tokens": tokens,
        "results": results,
    }
    if info.is_main:
        path = Path(spec.run_dir) / EVAL_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        os.replace(tmp, path)
    log.result(
        results[-1]["step"] or 0, results[-1]["loss"], "completed", eval=str(Path(spec.run_dir) / EVAL_FILE)
    )
    log.print(f"eval: wrote {Path(spec.run_dir) / EVAL_FILE}")
    return 0
