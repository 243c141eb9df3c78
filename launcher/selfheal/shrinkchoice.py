"""At a shrink that cannot grow back: train on at a smaller data-parallel
degree, or requeue for a full allocation, whichever the forecast says is
cheaper.

The supervisor (launcher/selfheal/restart.py ``after_fault``) asks when a fault
leaves too few healthy nodes, a shrunk layout fits, and no left-out node can
grow back (launcher/selfheal/growback.py: a node the job still holds passes its
burn-ins and returns at the cost of one restart; a requeue costs a restart,
a queue wait and an allocation's start-up, so a held node is always given
its burn-ins). Both options finish the same remaining steps:

- **stay shrunk**: the job keeps every node it holds now (a left-out one
  idle: goodput's ``degraded``) while the remaining steps run at the shrunk
  step time (the measured one x planned dp / shrunk dp: the global batch is
  kept by gradient accumulation).
- **requeue**: the job holds nothing while it waits for a full allocation
  (Slurm's own estimate: ``sbatch --test-only`` of the job's size,
  partition, QOS, account and time limit without the bad nodes; the nodes
  this job holds count as busy, so the wait is if anything overstated), then
  a restart (this cluster's measured restart cost, else the prior) and the
  remaining steps at the measured step time on the job's full size.

Requeue when it is cheaper in GPU-seconds held and finishes no later: it
never trades a later finish for GPU-hours, nor GPU-hours for a sooner
finish. Both options' figures are said and kept in the fault record
(``choice``). A node gone from the allocation (Slurm removed it) leaves the
job holding fewer GPUs for longer, about the same GPU-seconds, and a
requeue only adds its restart: meshrun stays. No estimate (Slurm cannot
say, no step time measured yet): it stays, and says why.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field
from typing import Any

from launcher.slurm.nodestate import job_info, slurm_cmd


@dataclass
class Choice:
    requeue: bool
    why: str
    figures: dict[str, Any] = field(default_factory=dict)


def choose(
    *,
    remaining_steps: int,
    step_s: float | None,
    dp_planned: int,
    dp_shrunk: int,
    restart_s: float,
    wait_s: float | None,
    held_gpus: int,
    full_gpus: int,
) -> Choice:
    """Stay shrunk or requeue (module docstring)."""
    if step_s is None or step_s <= 0:
        return Choice(False, "no step time measured yet: staying shrunk")
    if wait_s is None:
        return Choice(False, "Slurm gave no start estimate for a full allocation: staying shrunk")
    shrunk_step_s = step_s * dp_planned / max(1, dp_shrunk)
    stay_s = remaining_steps * shrunk_step_s
    stay_gpu_s = stay_s * held_gpus
    requeue_s = wait_s + restart_s + remaining_steps * step_s
    requeue_gpu_s = (restart_s + remaining_steps * step_s) * full_gpus
    figures = {
        "remaining_steps": remaining_steps,
        "step_s": round(step_s, 4),
        "shrunk_step_s": round(shrunk_step_s, 4),
        "restart_s": round(restart_s, 2),
        "queue_wait_s": round(wait_s, 1),
        "stay": {"finish_s": round(stay_s, 1), "gpu_s": round(stay_gpu_s, 1), "gpus": held_gpus},
        "requeue": {"finish_s": round(requeue_s, 1), "gpu_s": round(requeue_gpu_s, 1), "gpus": full_gpus},
    }
    requeue = requeue_gpu_s < stay_gpu_s and requeue_s <= stay_s
    why = (
        f"staying shrunk holds {stay_gpu_s / 3600:.3g} GPU-h and finishes in {stay_s:.0f} s; a requeue for a "
        f"full allocation {requeue_gpu_s / 3600:.3g} GPU-h, finishing in {requeue_s:.0f} s (queue wait "
        f"{wait_s:.0f} s by Slurm's estimate, restart {restart_s:.0f} s)"
    )
    figures["requeue_chosen"] = requeue
    return Choice(
        requeue, ("a requeue is cheaper and no later: " if requeue else "staying shrunk: ") + why, figures
    )


def _epoch(stamp: str) -> float | None:
    try:
        return dt.datetime.fromisoformat(stamp).timestamp()  # Slurm's local time, as sacct's
    except ValueError:
        return None


def full_start_wait_s(job: str, nodes: int, exclude: list[str], now: float) -> tuple[float | None, str]:
    """Slurm's estimate of the seconds until a job like ``job`` on ``nodes``
    nodes, without ``exclude``, could start (``sbatch --test-only``: nothing
    is submitted); (None, why) when it cannot say."""
    fields, why = job_info(job)
    if "Partition" not in fields:
        return None, f"scontrol show job {job}: {why or 'no partition'}"
    args = ["sbatch", "--test-only", f"--nodes={nodes}", f"--partition={fields['Partition']}"]
    for key, opt in (("QOS", "--qos"), ("Account", "--account"), ("TimeLimit", "--time")):
        if fields.get(key) and fields[key] not in ("(null)", "UNLIMITED"):
            args.append(f"{opt}={fields[key]}")
    gres = re.search(r"gpu[:=](\d+)", fields.get("TresPerNode", ""))
    if gres:
        args.append(f"--gres=gpu:{gres.group(1)}")
    mem = fields.get("MinMemoryNode", "")
    if re.fullmatch(r"\d+[KMGT]?", mem):
        args.append(f"--mem={mem}")
    if fields.get("OverSubscribe") == "NO":
        args.append("--exclusive")
    if exclude:
        args.append(f"--exclude={','.join(exclude)}")
    res = slurm_cmd([*args, "--wrap", "true"])
    m = re.search(r"to start at (\S+)", res.stderr + res.stdout)
    at = _epoch(m.group(1)) if m else None
    if at is None:
        return None, f"sbatch --test-only: {(res.stderr or res.stdout).strip()[:200]}"
    return max(0.0, at - now), ""
