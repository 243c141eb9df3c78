"""The training loop of pretrain and finetune: build, then loop, then finish.

:func:`train` reads top to bottom like torchtitan's train.py: :func:`build`
assembles the trainer (train/loop/build.py) and its checkpointed state and
resumes from the newest checkpoint; :func:`train_loop` runs the steps until
the last one or an agreed stop (a signal, saves that keep failing);
:func:`finish` waits (bounded) for the last commit, exports and reports, and
returns the task's exit code. train/jobs/entry.py calls it for both kinds.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

from launcher.config.runfiles import REQUEUE_EXIT_CODE, UNCOMMITTED_EXIT_CODE
from launcher.config.spec import RunSpec
from train.checkpoint import CheckpointManager
from train.loop.build import Trainer, build_trainer
from train.loop.signals import PreemptFlag, requeue_counts, stop_budget_s
from train.loop.state import Progress, build_app_state
from train.loop.step import read_scalars, train_step
from train.observe import heartbeat, hostsync
from train.observe.metrics import MetricsExporter
from train.observe.probe import SoloProbe
from train.observe.runlog import RunLog, device_peak_tflops, mfu, peak_mem_gb
from train.parallel.dist import DistInfo
from train.parallel.mesh import ParallelDims


@dataclasses.dataclass
class Run:
    """What the training loop works with (built once by :func:`build`)."""

    spec: RunSpec
    info: DistInfo
    dims: ParallelDims
    log: RunLog
    flag: PreemptFlag
    t: Trainer
    progress: Progress
    app_state: dict[str, Any]
    ckpt: CheckpointManager
    exporter: MetricsExporter
    start: int  # the step resumed from (0: a fresh start)
    # Called after each step's save decision (launcher.in_process_recovery:
    # the peer copies, train/loop/resilient.py); None: nothing.
    after_step: Any = None


def train(spec: RunSpec, info: DistInfo, dims: ParallelDims, log: RunLog, flag: PreemptFlag) -> int:
    """Pretrain or finetune: the task's exit code (0, or the requeue codes after a signal)."""
    run = build(spec, info, dims, log, flag)
    step, loss, status = train_loop(run)
    return finish(run, step, loss, status)


def build(
    spec: RunSpec, info: DistInfo, dims: ParallelDims, log: RunLog, flag: PreemptFlag, resume: bool = True
) -> Run:
    """Build the trainer and its state, resume from the newest checkpoint
    (``resume=False``: in-process recovery restores from memory instead)."""
    plan, tc = spec.plan, spec.cfg.train
    t = build_trainer(spec, info, dims)
    progress = Progress()
    app_state = build_app_state(t.parts, t.optims, t.schedulers, t.loader, progress)
    ckpt = CheckpointManager(spec, info, deferred_worker=not resume)
    heartbeat.beat("restore")
    t_restore = time.time()
    start = ckpt.resume(app_state) if resume else 0
    if start:
        progress.restarts += 1
        # restore_s: the goodput's restore bucket (launcher/views/goodput.py).
        restore_s = time.time() - t_restore
        log.event(
            "resume", step=start, restore_s=restore_s, restarts=progress.restarts, requeues=requeue_counts()
        )
        log.print(f"resumed from step {start} (restart {progress.restarts})")
    exporter = MetricsExporter(spec, info)
    log.print(
        f"training {spec.cfg.model.name} ({plan.params / 1e6:.1f}M params) on {info.world_size} "
        f"{info.backend} ranks: mesh {dims.names()}, {plan.precision}, AC {plan.activation_checkpointing}, "
        f"compile {plan.compile}, steps {start + 1}..{tc.steps}"
    )
    if t.float8_note:
        log.print(t.float8_note)
    run = Run(spec, info, dims, log, flag, t, progress, app_state, ckpt, exporter, start)
    exporter.update({"save_every_steps": ckpt.every_steps})
    if ckpt.tuner:  # the launcher's interval, before any save is measured
        a = ckpt.tuner.chosen
        _log_interval(run, ckpt.tuner.record(a.steps, a.save_cost_s, a.step_s, "predicted"))
    return run


def train_loop(run: Run) -> tuple[int, float | None, str]:
    """The training loop: (last step, its loss, completed | preempted).

    No host sync on a step that logs nothing: loss and grad norm stay on the
    device (read on logging steps, the exact value of that step), and the
    stop vote started after step N is read after step N+1 (train/loop/signals.py).
    """
    spec, t, tc, exporter = run.spec, run.t, run.spec.cfg.train, run.exporter
    tokens_per_step = spec.plan.global_batch_size * spec.cfg.model.seq_len
    # Once, before the loop: on a CPU host not probed yet this runs the probe.
    peak_tflops = device_peak_tflops(spec)
    watch = hostsync.watch(tc.host_sync_check)
    # None (JSON null) when a rerun finds the run already finished.
    loss, status, step, loss_t = None, "completed", run.start, None
    vote, window = None, _Window(time.perf_counter())
    probe = _solo_probe(run)
    for step in range(run.start + 1, tc.steps + 1):
        logging = step % tc.log_every_steps == 0 or step in (run.start + 1, tc.steps)
        # The supervisor's hang watch (launcher/selfheal/hangwatch.py): a process's
        # first step (lazy init, DTensor sharding caches, compile: minutes on
        # an 80-layer model) is "warmup", under the start-up limit; then each
        # step is under the step limit.
        heartbeat.beat("warmup" if step == run.start + 1 else "step", step)
        if step > run.start + 1:  # the warm-up step's lazy init would be timed too
            probe.maybe(step)
        step_syncs_at = watch.count if watch else 0
        with hostsync.during(watch, allowed=logging):
            # The collective sampler profiles at most this one step, and only
            # stops the profiler here: its trace is read off the loop, so the
            # stop decision below is never delayed by it.
            exporter.step_begin(step)
            inputs, targets = next(t.loader)
            window.wait_s += t.loader.last_wait_s
            loss_t, grad_norm_t = train_step(t, inputs, targets)
            exporter.step_end(step)
            window.steps += 1
            run.progress.step, run.progress.tokens = step, run.progress.tokens + tokens_per_step
            if logging:
                loss, grad_norm = read_scalars(loss_t, grad_norm_t)  # waits for this step
                dt, wait_s = window.take()
                syncs = _syncs(watch, window, step_syncs_at)
                _log_step(run, step, loss, grad_norm, dt, wait_s, tokens_per_step / dt, peak_tflops, syncs)
            # Every rank must decide to stop at the same step; the signal
            # handler itself only set a flag. Saves that keep failing stop the
            # run, as soon as one rank knows, not at the next save.
            vote, agreed = _vote(run, vote, last=step == tc.steps)
        preempted, failing, due = agreed
        if failing:
            try:
                run.ckpt.stop_failing()  # raises CheckpointError on every rank
            finally:
                _report_saves(run, run.ckpt.drain())
        if _maybe_save(run, step, preempted, due):
            probe.saved_at = step
        if run.after_step is not None:
            run.after_step(step)
        if preempted:
            status = "preempted"
            break
    if vote is not None:
        vote.result()  # the vote of the last step: every rank started it
    if loss_t is not None and not logging:
        loss = read_scalars(loss_t)[0]  # stopped on a step that logged nothing
    return step, loss, status


def finish(run: Run, step: int, loss: float | None, status: str) -> int:
    """Wait (bounded) for the last commit and uploads, export, report."""
    spec, log, flag = run.spec, run.log, run.flag
    # After a signal, wait for the commit and uploads only as long as Slurm
    # leaves before its kill; the next start finishes what is left.
    lead = spec.plan.signal_lead_s or spec.cfg.launcher.signal_lead_s
    budget = stop_budget_s(flag, lead, spec.cfg.qos.grace_time_s)
    heartbeat.beat("done", step)
    try:
        report = run.ckpt.finalize(timeout_s=budget)
    finally:
        _report_saves(run, run.ckpt.drain())
    run.exporter.close()
    final_lost, why = False, ""
    if run.ckpt.last_saved_step == step:
        committed, why = _final_commit(report, run.info.rank, run.ckpt.dir_leader)
        final_lost = not committed
    if final_lost and status == "completed":
        from train.checkpoint.saving import CheckpointError

        raise CheckpointError(
            f"the final checkpoint (step {step}) did not commit: {why}; newest "
            f"committed step: {run.ckpt.committed[-1] if run.ckpt.committed else 'none in this run'}"
        )
    if status == "completed" and spec.cfg.job.export_hf:
        from train.models.hf import export_live

        t = run.t
        export_live(t.parts, t.mesh, run.dims, spec.cfg.model, spec.cfg.job.export_hf, spec.cfg.job.hf_path)
        log.print(f"exported the weights in Hugging Face format to {spec.cfg.job.export_hf}")
    log.result(step, loss, status)
    if status == "preempted":
        log.event("preempted", step=step, signal=flag.reason, wait_budget_s=budget)
        if final_lost:
            newest = run.ckpt.committed[-1] if run.ckpt.committed else "the newest one of earlier runs"
            log.print(
                f"stopped by {flag.reason} at step {step}: checkpoint of step {step} NOT committed "
                f"({why}); a restart resumes from step {newest}; "
                f"exit {UNCOMMITTED_EXIT_CODE}"
            )
            _barrier()
            return UNCOMMITTED_EXIT_CODE
        log.print(
            f"stopped by {flag.reason} at step {step}: checkpoint of step {step} committed; "
            "the batch script requeues the job unless Slurm says it was cancelled"
        )
        _barrier()
        return REQUEUE_EXIT_CODE
    log.print(
        f"done: step {step}" + (f", loss {loss:.4f}" if loss is not None else " (nothing left to train)")
    )
    return 0


@dataclasses.dataclass
class _Window:
    """The steps since the last logging step: their time, read when the
    loop next waits for the device (a logging step), spread over them."""

    t0: float
    steps: int = 0
    wait_s: float = 0.0
    syncs_at: int = 0  # the host-sync count (train.host_sync_check) at the last take

    def take(self) -> tuple[float, float]:
        """(seconds per step, data wait per step) since the last take."""
        now = time.perf_counter()
        n = max(self.steps, 1)
        out = ((now - self.t0) / n, self.wait_s / n)
        self.t0, self.steps, self.wait_s = now, 0, 0.0
        return out


def _syncs(watch: Any, window: _Window, step_syncs_at: int) -> dict[str, int]:
    """train.host_sync_check: host syncs of the steps since the last logging
    step that logged nothing (0 by design), and of this logging step."""
    if watch is None:
        return {}
    out = {
        "host_syncs": step_syncs_at - window.syncs_at,
        "host_syncs_logging_step": watch.count - step_syncs_at,
    }
    window.syncs_at = watch.count
    return out


def _vote(run: Run, vote: Any, last: bool) -> tuple[Any, tuple[bool, bool, bool]]:
    """Start this step's stop vote (signal, saves failing, a time-based
    save due) and read the previous step's: (the vote in flight, (preempted,
    failing, due)). The last step reads its own vote at once."""
    ckpt = run.ckpt
    prev = vote
    vote = run.flag.vote((ckpt.failing(), ckpt.save_due()), getattr(ckpt, "ctl_pg", None))
    agreed = prev.result() if prev is not None else (False, False, False)
    if last:
        now, vote = vote.result(), None
        agreed = tuple(a or b for a, b in zip(agreed, now, strict=True))
    return vote, agreed  # type: ignore[return-value]


def _solo_probe(run: Run) -> Any:
    """The straggler watch's per-rank probe (train/observe/probe.py): on under
    the supervisor (heartbeats written) unless launcher.straggler=off."""
    lc = run.spec.cfg.launcher
    on = heartbeat.active() and lc.straggler != "off"
    return SoloProbe(lc.straggler_probe_every_steps if on else 0, run.t.device)


def _maybe_save(run: Run, step: int, preempted: bool, due: bool) -> bool:
    """The checkpoint of ``step`` when one is due (the same answer on every
    rank: the flags are agreed), then the outcomes known so far; True when
    it saved."""
    tc = run.spec.cfg.train
    final = step == tc.steps and tc.checkpoint_at_end
    _log_interval(run, run.ckpt.retune())
    saved = run.ckpt.should_save(step, final=final, preempted=preempted, due=due)
    if saved:
        heartbeat.beat("save", step)
        try:
            run.ckpt.save(step, run.app_state)
        finally:  # the outcome that stops the run is reported too
            _report_saves(run, run.ckpt.drain())
        run.log.event("checkpoint", step=step, save_s=run.ckpt.last_save_s)
    _report_saves(run, run.ckpt.poll())
    return bool(saved)


def _log_interval(run: Run, rec: dict | None) -> None:
    """storage.save_every_steps=auto: the interval and its inputs to the run
    log (every re-tune; a change also on rank 0's output) and the exporter."""
    if rec is None:
        return
    run.log.event("save_interval", **rec)
    run.exporter.update({"save_every_steps": rec["steps"]})
    if rec["steps"] != rec["previous_steps"] or rec["basis"] == "predicted":
        mtbf = f"{rec['mtbf_s'] / 3600:.3g} h" if rec["mtbf_s"] else "none expected"
        run.log.print(
            f"save interval (auto): every {rec['steps']} steps (was {rec['previous_steps']}); "
            f"{rec['basis']} save {rec['save_cost_s']:.3g} s, step {rec['step_s']:.3g} s, MTBF {mtbf} "
            f"({rec['mtbf_source']}), bounds [{rec['min_steps']}, {rec['max_steps']}]"
        )


def _log_step(
    run: Run,
    step: int,
    loss: float,
    grad_norm: float,
    dt: float,
    wait_s: float,
    tps: float,
    peak_tflops: float,
    host_syncs: dict[str, int] | None = None,
) -> None:
    """One step's figures to the run log and the metrics exporter. ``dt``
    and ``wait_s``: per step, over the steps since the last logging step."""
    world = run.info.world_size
    metrics = {
        "step": step,
        "loss": loss,
        "lr": run.t.schedulers[0].get_last_lr()[0],
        "grad_norm": grad_norm,
        "step_time_s": dt,
        "tokens_per_s": tps,
        "tokens_per_s_per_gpu": tps / world,
        "mfu": mfu(tps / world, run.spec.plan.flops_per_token, peak_tflops),
        "data_wait_s": wait_s,
        "data_wait_pct": 100.0 * wait_s / dt,
        "peak_mem_gb": peak_mem_gb(run.t.device),
    }
    metrics.update(host_syncs or {})  # train.host_sync_check only
    run.log.step(metrics)
    run.exporter.update(metrics)
    if run.ckpt.tuner and step > run.start + 1:  # not the first step: start-up, warmup
        run.ckpt.tuner.observe_step(dt)
    # The last save's stall is final by now (it includes any wait in
    # the next optimizer step for staging).
    run.exporter.record_checkpoint(stall_s=run.ckpt.last_save_s, upload_lag_s=run.ckpt.upload_lag_s)


def _report_saves(run: Run, outcomes: list[tuple[int, str]]) -> None:
    """Each save's outcome, once known: an event in metrics.jsonl, the
    exporter's series, and a failure on rank 0's output."""
    ckpt = run.ckpt
    for step, error in outcomes:
        run.exporter.record_save(step, ok=not error, failures_in_a_row=ckpt.failures_in_a_row)
        if not error:
            run.log.event("checkpoint_committed", step=step)
            continue
        run.log.event("checkpoint_failed", step=step, error=error, failed_in_a_row=ckpt.failures_in_a_row)
        limit = run.spec.cfg.storage.max_failed_saves
        run.log.print(
            f"checkpoint of step {step} FAILED, not committed ({ckpt.failures_in_a_row} in a row"
            + (f"; the run stops at {limit}" if limit else "")
            + f"): {error}"
        )


def _final_commit(report: dict, rank: int, dir_leader: bool) -> tuple[bool, str]:
    """Whether the final save committed, one answer on every rank, and why
    not. Any rank's failure counts (a directory leader whose manifest write
    failed is not outvoted by the ranks whose directories committed), and so
    does a directory leader that never saw its own commit; a rank that is no
    leader and stopped waiting (its signal's budget ran out first) counts
    for nothing."""
    done = bool(report["commit_done"])
    # The highest failing rank + 1, the highest unsure leader + 1, any rank saw it.
    flags = [
        rank + 1 if report.get("commit_failed") else 0,
        rank + 1 if dir_leader and not done else 0,
        int(done),
    ]
    if report.get("commit_failed"):  # rank 0 prints the run's lines; this rank says its own cause
        print(f"meshrun train: rank {rank}: the final checkpoint did not commit: {report['last_save_error']}",
              file=sys.stderr, flush=True)  # fmt: skip
    if dist.is_available() and dist.is_initialized():
        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        t = torch.tensor(flags, dtype=torch.int32, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        flags = [int(x) for x in t.tolist()]
    failed, unsure, seen = flags
    if not failed and not unsure and seen:
        return True, ""
    if not done:
        return False, report["last_save_error"]
    if failed:
        return False, f"rank {failed - 1}'s commit failed; its output says why"
    return False, f"rank {unsure - 1}, a directory leader, did not see its commit in time"


def _barrier() -> None:
    """All ranks leave together: Slurm's kill-on-bad-exit treats the requeue
    exit code as a failure and signals the ranks still finishing."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
