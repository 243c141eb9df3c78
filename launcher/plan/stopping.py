"""Time to stop a Slurm job cleanly: the signal windows and the final save.

When Slurm wants a job gone it signals first and kills later:

- time limit: USR2 ``launcher.signal_lead_s`` before the limit, then SIGTERM
  and SIGKILL at the limit;
- preemption: USR2 (``send_user_signal``) or SIGTERM at the start of the
  QOS's ``GraceTime`` (``qos.grace_time_s``), the kill at its end;
- ``scancel`` and ``srun --kill-on-bad-exit``: SIGTERM, SIGKILL ``KillWait``
  (30 s by default) later.

Between the signal and the kill the ranks finish their step, save and commit
a checkpoint, wait for uploads, exit, and the batch script requeues the job.
The trainer bounds its waits by the window minus :func:`stop_margin_s`
(train/loop/signals.py); this module checks at plan time that the final save fits
(pure Python, no torch).
"""

from __future__ import annotations

import math

from launcher.config.plandata import STOP_MARGIN_S, stop_margin_s
from launcher.config.schema import RunConfig
from launcher.config.validate import fail

# The planned USR2 lead when the final save is quick.
DEFAULT_LEAD_S = 120
# DCP checkpoint bytes per parameter: fp32 parameters + two AdamW moments.
CKPT_BYTES_PER_PARAM = 12
GB = 1e9


def final_save_s(cfg: RunConfig, params: int, nodes: int) -> float:
    """Expected seconds for the save after a signal to be committed on every
    node (stage, then write this node's shards), from the performance
    model's calibration (conf/perf/default.yaml)."""
    from launcher.perf import load_params

    p = load_params()
    node_bytes = params * CKPT_BYTES_PER_PARAM / max(nodes, 1)
    st = cfg.storage
    # The node-local tier is written first; without one, the run dir's.
    bw = p.nvme_write_gb_per_s_per_node if st.local_dir else p.shared_fs_write_gb_per_s_per_node
    stage = p.checkpoint_stage_fixed_s + node_bytes / (p.checkpoint_stage_gb_per_s * GB)
    return stage + node_bytes / (bw * GB)


def plan_signal_lead_s(cfg: RunConfig, params: int, nodes: int, step_s: float = 0.0) -> tuple[int, list[str]]:
    """(the USR2 lead time to request, warnings). ``launcher.signal_lead_s=0``
    plans it: :data:`DEFAULT_LEAD_S`, or the expected final save plus margin
    when that is longer; a time limit too short for it is refused (the lead is
    never quietly shortened). An explicit value too
    short for the final save is refused, saying what to change; a QOS grace
    time too short for it is a warning (the admin sets it). ``step_s``: the
    predicted step time, counted once into the save's time: the trainer
    reads the stop vote a step after it starts it (train/loop/signals.py), so a
    signal can cost one step more before the save begins."""
    # eval and generate save no checkpoint on a signal (generate's completions
    # are already on disk, line by line): nothing to wait for but the exit.
    save_s = final_save_s(cfg, params, nodes) + step_s if cfg.job.kind not in ("eval", "generate") else 0.0
    lead, grace = cfg.launcher.signal_lead_s, cfg.qos.grace_time_s
    limit_s = cfg.qos.time_limit_min * 60
    if lead == 0:
        lead = max(DEFAULT_LEAD_S, math.ceil(save_s + STOP_MARGIN_S))
        if lead >= limit_s:
            # The planned lead is not shortened to fit a short limit: the
            # limit as typed is refused, saying both ways out.
            shortest = int(save_s + STOP_MARGIN_S) + 1
            explicit = (
                f", or launcher.signal_lead_s=N with {shortest} <= N < {limit_s} (the final save needs "
                f"about {save_s:.0f} s + {STOP_MARGIN_S:.0f} s to exit and requeue)"
                if shortest < limit_s
                else ""
            )
            raise fail(
                "qos.time_limit_min",
                cfg.qos.time_limit_min,
                f"a {limit_s} s time limit leaves no room for the planned {lead} s signal lead "
                f"(launcher.signal_lead_s=0: USR2 {lead} s before the limit, to checkpoint and requeue): "
                f"set qos.time_limit_min>={lead // 60 + 1}{explicit}",
            )
    need = save_s + stop_margin_s(lead)
    if lead < need:
        raise fail(
            "launcher.signal_lead_s",
            lead,
            f"the checkpoint after the time-limit signal (the step in flight, then the save) takes about {save_s:.0f} s "
            f"({params * CKPT_BYTES_PER_PARAM / max(nodes, 1) / GB:.1f} GB per node) and the job needs "
            f"{stop_margin_s(lead):.0f} s more to exit and requeue: set launcher.signal_lead_s >= "
            f"{int(save_s + STOP_MARGIN_S) + 1}, or make the save faster (storage.local_dir on node-local NVMe, "
            "more nodes to spread the shards)",
        )
    warnings = []
    if grace < save_s + stop_margin_s(grace):
        warnings.append(
            f"qos.grace_time_s={grace} is shorter than the checkpoint after a preemption signal "
            f"(about {save_s:.0f} s + {stop_margin_s(grace):.0f} s to requeue): a preempted job loses the "
            f"steps since its last save; ask the admin for GraceTime >= {int(save_s + STOP_MARGIN_S) + 1} "
            f"on QOS {cfg.qos.qos}"
        )
    return lead, warnings
