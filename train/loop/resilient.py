"""The training loop under in-process recovery (launcher.in_process_recovery).

Every ``launcher.peer_copy_every_steps`` steps each rank copies its state
into host memory and swaps it with its partner (train/inprocess/peerstate.py).
When a collective fails (a peer died, or hung past the bounded collective
timeout: the launcher kills it then) the survivors keep their processes:
they leave the broken generation (train/inprocess/rendezvous.py), meet the
replacement the launcher started at the next one, rebuild the trainer on the
new process groups, agree on the newest step every needed copy holds, hand
the replacement its state from its partner's memory, roll back and go on at
the same world size. No step every copy holds (a partner pair lost at once):
the durable checkpoint, as a restart would.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import time
from typing import Any

import torch.distributed as dist

from launcher.config.health import append_fault
from launcher.config.spec import RunSpec
from train.inprocess import peerstate
from train.inprocess.peerstate import PeerCopies
from train.inprocess.rendezvous import Rendezvous, is_replacement
from train.loop.signals import PreemptFlag
from train.loop.trainer import Run, build, finish, train_loop
from train.observe import heartbeat
from train.observe.runlog import RunLog
from train.parallel.dist import DistInfo
from train.parallel.mesh import ParallelDims


def _peer_failure(e: BaseException) -> bool:
    """A collective that failed because a peer went away (or our watcher
    aborted it after another rank saw that), not this rank's own bug."""
    if isinstance(e, dist.DistError):
        return True
    text = str(e)
    return isinstance(e, RuntimeError) and any(
        s in text for s in ("gloo", "Connection closed", "Connection reset", "aborted", "NCCL")
    )


def train_resilient(
    spec: RunSpec, info: DistInfo, dims: ParallelDims, log: RunLog, flag: PreemptFlag, rdzv: Rendezvous
) -> int:
    """train() with in-process recovery: the task's exit code."""
    plan = spec.plan
    off = peerstate.partner_offset(info.world_size, plan.ranks_per_node, plan.nodes)
    copies = PeerCopies(info.rank, info.world_size, off)
    rec = _Recovery(spec, info, dims, log, flag, rdzv, copies)
    run = rec.rebuild(None) if is_replacement() else rec.first()
    while True:
        try:
            step, loss, status = train_loop(run)
            break
        except Exception as e:
            if not _peer_failure(e):
                raise
            fault = (time.time(), run.progress.step, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
        # Out of the except block: the traceback's frames (the old trainer) are gone.
        copies.freeze()  # a swap still running changes no copy the recovery agrees on
        rdzv.leave(fault[2])
        _drop(run)
        # The old groups must be freed, not only forgotten: their sockets
        # close, and a peer blocked in a collective the abort came too late
        # for (issued after it) gets its error now, not at the timeout.
        del run
        gc.collect()
        run = rec.rebuild(fault)
    with contextlib.suppress(Exception):  # the last swap: no peer is left waiting on it
        copies.wait(rdzv.broken)
    return finish(run, step, loss, status)


class _Recovery:
    """One rank's recoveries: the peer copies, rebuilds, the agreed step."""

    def __init__(self, spec, info, dims, log, flag, rdzv: Rendezvous, copies: PeerCopies) -> None:
        self.spec, self.info, self.dims, self.log, self.flag = spec, info, dims, log, flag
        self.rdzv, self.copies = rdzv, copies
        self.every = max(1, spec.cfg.launcher.peer_copy_every_steps)
        self.peer_pg: Any = None
        self.pending: dict[str, Any] | None = None  # the fault record, written after the first resumed step
        self.copy_s, self.copy_mb = 0.0, 0.0  # the last peer copy's seconds (capture + swap) and size
        self.bounded = False

    def first(self) -> Run:
        """The run's start: build, resume from the durable checkpoint, the first copy."""
        run = self._wire(build(self.spec, self.info, self.dims, self.log, self.flag))
        self._copy(run, run.start)
        return run

    def rebuild(self, fault: tuple[float, int, str] | None) -> Run:
        """Form the next generation with the replacement (a survivor: after
        leaving the broken one), rebuild the trainer, restore the agreed step."""
        t_fault, last_step = time.time(), 0
        if fault is not None:
            t_fault, last_step, _ = fault
            self.rdzv.join(self.rdzv.current())
        t_formed = time.time()
        run = self._wire(build(self.spec, self.info, self.dims, self.log, self.flag, resume=False))
        t_joined = time.time()
        own, held = self.copies.steps()
        mine = (
            own,
            held,
            last_step,
            t_fault if fault else None,
            self.rdzv.arrived_at,  # left the broken generation (a replacement: started), came to this one
            fault[2][:200] if fault else "",
        )
        everyone: list[Any] = [None] * self.info.world_size
        dist.all_gather_object(everyone, mine)
        step, replaced = peerstate.agreed_step(everyone, self.copies.off)
        source = "peer memory"
        if step is None:  # a partner pair lost: the durable checkpoint
            source = "durable checkpoint"
            step = run.ckpt.resume(run.app_state)
            blob = peerstate.capture(run.t.parts, run.t.optims, run.app_state)
        else:
            blob = self._hand_over(step, replaced)
            peerstate.restore(blob, run.t.parts, run.t.optims, run.app_state)
        run.start = step
        run.progress.restarts += 1
        self.copies.clear()
        self.copies.exchange(step, blob, self.peer_pg)
        t_restored = time.time()
        t_faults = [e[3] for e in everyone if e[3] is not None]
        done = max(e[2] for e in everyone)
        t_fault = min(t_faults) if t_faults else t_joined
        # The broken generation's first word, and the ranks the launcher
        # killed as hung (the store host named them) for this one to form.
        why = self.rdzv.fault_of(self.rdzv.gen - 1) if self.rdzv.gen > 0 else ""
        hung = self.rdzv.hung_before(self.rdzv.gen)
        self.pending = {
            "cause": "rank_hung" if replaced and set(replaced) <= hung else "rank_lost",
            "hung_ranks": sorted(hung),
            "detected_by": why[:200],
            "action": "in_process",
            "ranks": replaced,
            "state_from": source,
            "generation": self.rdzv.gen,
            "rolled_back_to": step,
            "step": done,
            "steps_redone": max(0, done - step),
            "fault_at": t_fault,
            "rejoin_s": t_joined - t_fault,  # to the trainer rebuilt on the new generation
            "formed_s": round(t_formed - t_fault, 3),  # to the new generation's group formed
            "restored_s": round(t_restored - t_fault, 3),  # to the agreed step restored and copied
            # Where the rejoin went: the last survivor to come to it (its rank
            # and the error it left on), the replacement's arrival (its start-up,
            # or a warm spare's assignment), from the fault.
            "left_s": _arrived_s(everyone, t_fault, lambda r: r not in replaced),
            "last_to_leave": _last_to_leave(everyone, replaced),
            "replacement_ready_s": _arrived_s(everyone, t_fault, lambda r: r in replaced),
        }
        # Goodput's marker (launcher/views/goodput.py): the steps after it are
        # this recovery's, the fault .. the first of them its own bucket.
        self.log.event("in_process_resume", step=step, fault_time=t_fault, state_from=source)
        heartbeat.adopt_node_writer()  # a node whose writer was the lost rank (Slurm: heartbeats)
        role = "replacement" if fault is None else "survivor"
        print(f"meshrun train: rank {self.info.rank} (pid {os.getpid()}, {role}): in-process recovery at "
              f"generation {self.rdzv.gen}: rolled back to step {step} from {source}",
              file=sys.stderr, flush=True)  # fmt: skip
        return run

    def _hand_over(self, step: int, replaced: list[int]) -> bytes:
        """Each replacement's state from the rank that held it; a survivor's own copy."""
        me, c = self.info.rank, self.copies
        for f in replaced:
            if peerstate.holder_of(f, c.world, c.off) == me:
                peerstate.send_copy(c.held[step], f, self.peer_pg, c.timeout)
        if me in replaced:
            return peerstate.recv_copy(peerstate.holder_of(me, c.world, c.off), self.peer_pg, c.timeout)
        return c.own[step]

    def _wire(self, run: Run) -> Run:
        # The copies' own group: their point-to-point traffic never meets
        # the training group's collectives.
        self.peer_pg = self.rdzv.gloo_group()
        self.bounded = False  # the short collective timeout: after this generation's first step
        run.after_step = lambda step: self._after_step(run, step)
        return run

    def _after_step(self, run: Run, step: int) -> None:
        done_at = time.time()  # the step's end, before this step's copy
        if not self.bounded:
            self.rdzv.bound_collectives([run.exporter.port, run.ckpt.worker_store_port()])
            self.copies.timeout = self.rdzv.collective_timeout
            self.bounded = True
        if self.rdzv.broken.is_set():  # aborted after this step's collectives: issue no more
            raise RuntimeError(f"in-process recovery: generation {self.rdzv.gen} aborted")
        if step % self.every == 0:
            self._copy(run, step)
        if self.pending is not None:
            self._report(run, step, done_at)
            run.ckpt.start_worker()  # deferred by the rebuild until this first step was done

    def _copy(self, run: Run, step: int) -> None:
        """Capture this step's state; swap it with the partners beside the
        next step (the last swap waited for first: one in flight)."""
        t0 = time.perf_counter()
        self.copies.wait(self.rdzv.broken)
        blob = peerstate.capture(run.t.parts, run.t.optims, run.app_state)
        self.copies.exchange_async(step, blob, self.peer_pg)
        self.copy_s, self.copy_mb = time.perf_counter() - t0, len(blob) / 1e6

    def _report(self, run: Run, step: int, done_at: float) -> None:
        """The first step after a recovery: the fault's record with the
        seconds from the fault to this step's end (rank 0)."""
        rec, self.pending = self.pending, None
        rec["recovery_s"] = round(done_at - rec["fault_at"], 3)
        rec["first_step"] = step
        # What a copy costs this rank's step loop: the capture, and any wait for the last swap.
        rec["peer_copy_s"], rec["peer_copy_mb"] = round(self.copy_s, 4), round(self.copy_mb, 3)
        if self.info.rank == 0:
            rec["time"] = time.time()
            rec["error"] = (
                f"rank(s) {', '.join(map(str, rec['ranks']))} {'hung' if rec['cause'] == 'rank_hung' else 'lost'}"
            )
            append_fault(self.spec.run_dir, rec)
            append_fault(self.spec.run_dir, _resumed(rec, self.info.world_size))
            run.log.event("in_process_recovery", **{k: v for k, v in rec.items() if k != "time"})
            run.log.print(
                f"recovered in process: rank(s) {rec['ranks']} replaced, state from {rec['state_from']}, "
                f"rolled back to step {rec['rolled_back_to']} ({rec['steps_redone']} step(s) redone), "
                f"step {step} done {rec['recovery_s']:.2f} s after the fault"
            )


def _arrived_s(everyone: list[Any], t_fault: float, which: Any) -> float:
    """Seconds from the fault to the last of ``which`` ranks' arrival at the new generation."""
    return round(max((e[4] - t_fault for r, e in enumerate(everyone) if which(r)), default=0.0), 3)


def _last_to_leave(everyone: list[Any], replaced: list[int]) -> dict[str, Any] | None:
    """The survivor that came to the new generation last: its rank and its error."""
    survivors = [(e[4], r, e[5]) for r, e in enumerate(everyone) if r not in replaced]
    if not survivors:
        return None
    _, rank, error = max(survivors)
    return {"rank": rank, "error": error}


def _resumed(rec: dict[str, Any], world: int) -> dict[str, Any]:
    """The ``resumed`` record a restart's fault gets (launcher/selfheal/restart.py),
    for this recovery: the views count seconds lost and steps redone from it."""
    return {
        "event": "resumed",
        "recovery": "in_process",
        "cause": rec["cause"],
        "state_from": rec["state_from"],
        "generation": rec["generation"],
        "first_step": rec["first_step"],
        "seconds_lost": round(rec["recovery_s"], 2),
        "steps_redone": rec["steps_redone"],
        "world_size": world,
        "dp": world,
        "time": rec["time"],
    }


def _drop(run: Run) -> None:
    """What the broken generation's run held outside this process's memory:
    its checkpoint worker process and its metrics port."""
    worker = getattr(run.ckpt, "worker", None)
    if worker is not None:
        worker._kill()
    with contextlib.suppress(Exception):  # best effort: the new run opens its own
        run.exporter.close()
