"""The loop's stalls in a predicted step (launcher/perf/steptime.py): the data
loader's time beyond the step it is prefetched behind, and the share of
checkpoint saves that blocks the loop."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.perf import reliability
from launcher.perf.flops import tokens_per_sample
from launcher.perf.params import PerfParams

if TYPE_CHECKING:
    from launcher.config.plandata import Layout
    from launcher.config.schema import RunConfig

GB = 1e9


def data_stall(cfg: RunConfig, plan: Layout, p: PerfParams, busy_s: float, cpu: bool) -> float:
    """Loader time beyond the step it is prefetched behind."""
    d = cfg.data
    samples = plan.global_batch_size / plan.dp  # per data-parallel rank
    if d.kind == "synthetic":
        return 0.0
    if d.kind == "images":
        if d.use_dali and not cpu:
            load = samples / p.gpu_decode_images_per_s
        else:
            cores = max(1, min(d.num_workers, cfg.cluster.cpus_per_node // max(plan.ranks_per_node, 1)))
            load = samples / (p.cpu_decode_images_per_s_per_core * cores)
    else:  # pretokenized shards: int32 tokens read from node-local disk
        nbytes = samples * tokens_per_sample(cfg.model) * 4 * plan.ranks_per_node
        load = nbytes / (p.token_read_gb_per_s_per_node * GB)
    if d.num_workers == 0:
        return load  # loaded in the training loop: nothing overlaps
    return max(0.0, load - busy_s)


def checkpoint_stall(
    cfg: RunConfig, plan: Layout, p: PerfParams, sharded_params: float, step_s: float
) -> float:
    """Seconds per step the loop is blocked by saves, amortised."""
    st = cfg.storage
    nbytes = sharded_params * 12  # fp32 parameters + two AdamW moments (DCP)
    if st.async_save:
        blocked = p.checkpoint_stage_fixed_s + nbytes / (p.checkpoint_stage_gb_per_s * GB)
    else:
        bw = p.nvme_write_gb_per_s_per_node if st.local_dir else p.shared_fs_write_gb_per_s_per_node
        blocked = nbytes * plan.ranks_per_node / (bw * GB)
    every = 1.0 / reliability.planned_save_every_steps(cfg, plan, blocked, step_s)
    if st.save_every_min > 0:
        every = max(every, step_s / (60 * st.save_every_min))
    return blocked * min(every, 1.0)
