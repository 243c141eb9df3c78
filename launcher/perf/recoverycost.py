"""What one fault costs a run, from figures measured on meshrun's test
cluster, scaled to N ranks by a stated model: the one source of the restart
cost, the work redone and the save cost for scripts/bench_goodput.py and the
dry run's risk rows (launcher/plan/forecast.py).

Measured here (each figure's command or page beside it):

- a rank SIGKILLed, meshrun's trainer, 2 nodes x 2 tasks on the test cluster,
  saves every 20 steps (issue 54, at 8f4b6bc): detected after 0.49 s, first
  resumed step 12.0 s after the fault (srun, Python, torch import, process
  group, model build, checkpoint read: every rank relaunched), 3 steps redone;
  a job=script program on a spare: 9-11 s. ``faults.jsonl``'s ``resumed``
  events hold these as ``detect_s``, ``seconds_lost``, ``steps_redone``
  (docs/CONTRACTS.md).
- a save's cost to the loop, tiered (async) checkpoint, 302 MB of model and
  optimizer state, 1 rank: 0.249 s per save (docs/checkpoint-stall.md,
  ``python scripts/bench_checkpoint.py``, the O_DIRECT row; 1.0-3.7 s for a
  blocking ``torch.distributed.checkpoint.save`` of the same state).

The model that scales them to N ranks (assumptions, stated as such):

- **today** (every rank relaunched, state read back from the checkpoint):
  restart = detection (0.49 s) + the measured start-up at 4 ranks
  (12.0 - 0.49 s) + ``RDZV_S_PER_DOUBLING`` per doubling of the ranks beyond
  4 (srun's launch tree, the TCP store rendezvous and the communicator build
  each add a tree level per doubling) + the checkpoint read: one node's share
  of the state at ``CKPT_READ_GB_PER_S_PER_NODE`` (the replacement reads it
  from the shared tier; the survivors from their own NVMe, faster). Work
  redone: everything since the last committed checkpoint (the simulation
  draws it).
- **in-process + peer state** (the survivors keep their processes, the
  replacement is warm, state comes from a partner's host memory), from
  meshrun's own figures: restart = detection + the rendezvous's store
  operations at N ranks (``RDZV_OPS_PER_RANK`` a rank through one store
  host at ``STORE_OPS_PER_S``, the slowest of ``python
  scripts/bench_rendezvous.py --ranks 256 1024``'s runs: linear in ranks)
  + the rebuild measured at 4 ranks (``INPROC_REBUILD_S``: the new
  generation formed to the first resumed step done: the trainer rebuilt on
  the new groups, the agreed step handed over and restored, one step; the
  test cluster's in-process test, warm spare). On CPU (gloo, whose abort
  closes no connection) the survivors shut the broken generation's
  connections down (train/inprocess/sever.py), as NCCL's abort ends its
  operations: no survivor waits out the collective timeout; the warm
  spare's assignment (0.03-0.9 s measured) overlaps the rendezvous. Work
  redone: the broken step, one iteration (at most one more when a swap
  was in flight); no checkpoint read.
  ``PEER_FALLBACK_SHARE`` of failures (both partners lost, a job-wide
  fault) still take today's path. Keeping the copy costs each step one
  node's share of the state sent to its partner at
  ``PEER_COPY_GB_PER_S_PER_NODE``, counted in full (no overlap: an upper
  bound; the trainer may copy every k steps where that is cheaper).
- a save's cost scales with each rank's shard (state / ranks) from the
  measured 0.249 s per 302 MB: every rank writes its own shard at once.

Standard library only; nothing here reads Slurm or torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# --- measured on the test cluster (see the module docstring) ----------------
DETECT_S = 0.49  # SIGKILL -> detected
RESUMED_S = 12.0  # SIGKILL -> first resumed step, every rank relaunched
MEASURED_RANKS = 4  # 2 nodes x 2 tasks
STEPS_REDONE = 3  # with saves every 20 steps: the work since the last commit
SCRIPT_RESUMED_S = (9.0, 11.0)  # job=script's program on a spare
SAVE_S = 0.249  # tiered save's cost to the loop (docs/checkpoint-stall.md)
SAVE_BYTES = 302e6  # ... of this much model and optimizer state on one rank

# In-process recovery (the module docstring): the test cluster's in-process
# test, SIGKILL with the warm spare (tests/cluster/test_inprocess_slurm_cluster.py,
# faults.jsonl's recovery_s - formed_s: 2.95 s; cluster=local: 3.0 s; kept as
# the bound after the warm spare preloaded torch._dynamo: 0.55-2.78 s in 12
# recoveries, 6 runs of a SIGKILL and a hang; 0.21-0.44 s in 4 since the
# rebuild's checkpoint workers start after the first resumed step: the bound
# stays, as room for NCCL's communicator set-up at scale, never measured here) and
# scripts/bench_rendezvous.py (1,024 ranks in 0.123-0.228 s: 36,000-67,000 store ops/s).
INPROC_REBUILD_S = 2.95
RDZV_OPS_PER_RANK = 8
STORE_OPS_PER_S = 36000.0

# --- assumptions of the scaling model (stated; bench_goodput.py varies them) -
RDZV_S_PER_DOUBLING = 2.0  # a full relaunch's start-up per doubling of the ranks
CKPT_READ_GB_PER_S_PER_NODE = 2.0  # a replacement node's read of its share (shared tier)
STATE_BYTES_PER_PARAM = 12  # model + optimizer state, as launcher/plan/stopping.py
PEER_FALLBACK_SHARE = 0.05  # failures in-process recovery cannot take (partner pair, job-wide)
PEER_COPY_GB_PER_S_PER_NODE = 50.0  # one 400 Gbit/s NIC's worth of a node's fabric for the copy


@dataclass(frozen=True)
class FaultCost:
    """One failure's cost under a policy: seconds until training resumes,
    and whether the work since the last durable checkpoint is redone (else
    ``redo_steps`` steps are)."""

    restart_s: float
    redo_since_checkpoint: bool
    redo_steps: float
    basis: str


def _doublings(ranks: int, base: int) -> float:
    return max(0.0, math.log2(max(1, ranks) / base))


def startup_s(ranks: int, rdzv_s_per_doubling: float = RDZV_S_PER_DOUBLING) -> float:
    """A full relaunch's start-up (after detection, before the checkpoint read) at ``ranks``."""
    return (RESUMED_S - DETECT_S) + rdzv_s_per_doubling * _doublings(ranks, MEASURED_RANKS)


def checkpoint_read_s(state_bytes: float, nodes: int) -> float:
    """One node's share of the state read back at CKPT_READ_GB_PER_S_PER_NODE."""
    return state_bytes / max(1, nodes) / (CKPT_READ_GB_PER_S_PER_NODE * 1e9)


def save_cost_s(state_bytes: float, ranks: int) -> float:
    """A tiered save's cost to the loop: the measured figure scaled by each rank's shard."""
    return SAVE_S * (state_bytes / max(1, ranks)) / SAVE_BYTES


def restart_today(
    ranks: int, state_bytes: float, gpus_per_node: int, rdzv_s_per_doubling: float = RDZV_S_PER_DOUBLING
) -> FaultCost:
    """Every rank relaunched, the state read back from the checkpoint."""
    nodes = max(1, ranks // max(1, gpus_per_node))
    s = DETECT_S + startup_s(ranks, rdzv_s_per_doubling) + checkpoint_read_s(state_bytes, nodes)
    basis = (
        f"measured {RESUMED_S:g} s at {MEASURED_RANKS} ranks + {rdzv_s_per_doubling:g} s per doubling "
        f"+ checkpoint read at {CKPT_READ_GB_PER_S_PER_NODE:g} GB/s per node (launcher/perf/recoverycost.py)"
    )
    return FaultCost(s, True, 0.0, basis)


def restart_inprocess(ranks: int) -> FaultCost:
    """Survivors stay up, a warm replacement takes the state from its partner's memory."""
    rdzv = RDZV_OPS_PER_RANK * max(1, ranks) / STORE_OPS_PER_S
    basis = (
        f"detection {DETECT_S:g} s + the rendezvous's {RDZV_OPS_PER_RANK} store ops a rank at "
        f"{STORE_OPS_PER_S:,.0f}/s + the rebuild measured at {MEASURED_RANKS} ranks ({INPROC_REBUILD_S:g} s)"
    )
    return FaultCost(DETECT_S + rdzv + INPROC_REBUILD_S, False, 1.0, basis)


def peer_copy_s(state_bytes: float, nodes: int) -> float:
    """Seconds a step spends sending one node's share of the state to its partner."""
    return state_bytes / max(1, nodes) / (PEER_COPY_GB_PER_S_PER_NODE * 1e9)
