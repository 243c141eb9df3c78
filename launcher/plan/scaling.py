"""Scaling efficiency across node counts (weak scaling: a fixed batch per GPU)."""

from __future__ import annotations

from launcher.perf.params import PerfParams
from launcher.perf.steptime import Prediction, predict


def scaling_efficiency(
    overrides: list[str], nodes: list[int], seqs_per_gpu: int = 2, params: PerfParams | None = None
) -> list[tuple[int, float, Prediction]]:
    """(GPUs, tokens/s/GPU relative to the first point, prediction) per node count."""
    from launcher.config.compose import compose
    from launcher.plan.make import make_plan

    out: list[tuple[int, float, Prediction]] = []
    base = 0.0
    for n in nodes:
        probe = compose([*overrides, f"cluster.nodes={n}"])
        gpus = n * max(
            probe.cluster.gpus_per_node, probe.cluster.local_processes if probe.cluster.kind == "local" else 1
        )
        cfg = compose([*overrides, f"cluster.nodes={n}", f"train.global_batch_size={seqs_per_gpu * gpus}"])
        plan = make_plan(cfg)
        pred = predict(cfg, plan, params)
        base = base or pred.tokens_per_s_per_gpu
        out.append((plan.world_size, pred.tokens_per_s_per_gpu / base, pred))
    return out
