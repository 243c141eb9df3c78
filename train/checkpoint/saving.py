"""The save path of a CheckpointManager: when to save, staging into the
shared CPU buffers while the next step runs (an optimizer pre-step hook holds
the next ``optimizer.step()`` until the copy is done), handing the step to
the checkpoint worker, waiting for its commit, and the final report.

No failed save is reported as saved. Every save ends in exactly one outcome
(committed, or failed with its cause), the same on every rank: a rank that
cannot stage still hands the step to its worker, with the error, so the
workers' collectives stay in step and the commit fails everywhere. Each
failure is logged with its cause, counted, written to
``<run_dir>/checkpoint_status.json`` (``meshrun status`` shows it) and
handed to the trainer (:meth:`SavePath.poll`: events, metrics). After
``storage.max_failed_saves`` failures in a row the next save raises
:class:`CheckpointError` instead of training on unprotected; a worker that
makes no progress for ``storage.worker_stall_timeout_s`` fails the save and
the run."""

from __future__ import annotations

import io
import json
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict_saver import _stateful_to_state_dict

from launcher.config.runfiles import CHECKPOINT_STATUS_FILE
from launcher.config.saveauto import steps_value
from train.checkpoint.autointerval import AutoInterval
from train.checkpoint.staging import SharedStager
from train.checkpoint.wiring import DCP_KEYS, Wiring, log

# Seconds between checks of the worker's progress while waiting for a commit.
_WATCH_S = 1.0


class CheckpointError(RuntimeError):
    """Saves keep failing, or the checkpoint worker is stuck or gone: the run
    must stop rather than train on without checkpoints."""


def _optimizers(app_state: dict[str, Any]) -> list[Any]:
    """The torch optimizers behind app_state (a bare optimizer, or a Stateful
    holding them in ``optims`` / ``optimizers``, as train.loop.state does)."""
    out: list[Any] = []
    for value in app_state.values():
        if isinstance(value, torch.optim.Optimizer):
            out.append(value)
        for attr in ("optims", "optimizers"):
            out += [o for o in getattr(value, attr, None) or [] if isinstance(o, torch.optim.Optimizer)]
    return out


class SavePath(Wiring):
    def _init_save_state(self) -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="ckpt-stage")
        self._staging: Future | None = None
        self._pending: int | None = None  # step handed to the worker, commit not yet seen
        self._stager = SharedStager(
            pin=torch.cuda.is_available() and str(self.info.device).startswith("cuda")
        )
        self._sent_version = 0
        self._last_save_time = time.monotonic()
        # storage.save_every_steps=auto: re-tuned after each save (autointerval.py).
        self.tuner = AutoInterval.from_spec(self.spec)
        self.every_steps = self.tuner.steps if self.tuner else steps_value(self.storage.save_every_steps)
        self.last_saved_step = -1
        self.last_save_s = 0.0  # loop blocked by the last save (the trainer logs it)
        self.blocked_s: list[float] = []
        self.committed: list[int] = []
        self._preempted = False
        self._held: threading.Event | None = None  # staging the next optimizer step waits for
        self._hooked: set[int] = set()  # optimizers that have the pre-step hook
        self.failed: dict[int, str] = {}  # step -> why its save failed
        self.failures_in_a_row = 0
        self._outcomes: list[tuple[int, str]] = []  # (step, "" or the error), not yet polled
        if self.storage.max_failed_saves < 0 or self.storage.worker_stall_timeout_s <= 0:
            raise ValueError(
                f"storage.max_failed_saves={self.storage.max_failed_saves} (0 or more; 0: never stop) and "
                f"storage.worker_stall_timeout_s={self.storage.worker_stall_timeout_s} (more than 0) "
                "are out of range"
            )

    # -- when ----------------------------------------------------------------
    def should_save(
        self, step: int, *, final: bool = False, preempted: bool = False, due: bool | None = None
    ) -> bool:
        """Same answer on every rank (the caller passes agreed flags). The
        time-based trigger: ``due`` as the loop's stop vote agreed it (from
        :meth:`save_due` a step earlier), else agreed here with one small
        blocking all-reduce."""
        if step <= 0 or step == self.last_saved_step:
            return False
        if preempted:
            self._preempted = True
        if final or preempted:
            return True
        every = self.every_steps
        if every > 0 and step % every == 0:
            return True
        if self.storage.save_every_min > 0:
            return due if due is not None else self._any_true(self.save_due(), self.ctl_pg)
        return False

    def save_due(self) -> bool:
        """This rank's clock says a time-based save is due (not agreed)."""
        minutes = self.storage.save_every_min
        return minutes > 0 and time.monotonic() - self._last_save_time >= 60.0 * minutes

    # -- save ----------------------------------------------------------------
    def save(self, step: int, app_state: dict[str, Any]) -> None:
        """Returns once the loop may continue: after staging when async,
        after the commit otherwise."""
        t0 = time.perf_counter()
        if step == self.last_saved_step:
            return
        self._wait_pending()  # the buffers are reused: the previous commit first
        self._stop_if_failing()
        path = self._path(step)
        error, extra, live = "", b"", None
        try:
            os.makedirs(path, exist_ok=True)
            state = {}
            for key, value in app_state.items():
                if key not in DCP_KEYS:
                    state[key] = value.state_dict() if hasattr(value, "state_dict") else value
            buf = io.BytesIO()
            torch.save(state, buf)
            extra = buf.getvalue()
            # Resume reads it with weights_only=True (no pickle from storage
            # runs code): anything else must fail this save, not the resume.
            torch.load(io.BytesIO(extra), map_location="cpu", weights_only=True)
            # References to the live tensors; the copy happens in the staging
            # thread, overlapping the next forward/backward. Model and optimizer
            # tensors change only in optimizer.step(), so a pre-step hook holds
            # the next step until the copy is done.
            live = _stateful_to_state_dict({k: app_state[k] for k in DCP_KEYS if k in app_state})
        except Exception as e:  # the worker still gets the step (see the module docstring)
            error = f"rank {self.rank}: preparing the save failed: {type(e).__name__}: {e}"
        staged = threading.Event()
        self._pending = step
        self.worker.start()  # a deferred one: spawned from this thread, not the staging thread
        self._staging = self._executor.submit(self._stage_and_send, step, path, live, extra, staged, error)
        optims = _optimizers(app_state)
        if not self.storage.async_save:
            self._wait_pending()
        elif optims:
            self._hold_optimizers(optims, staged)
        else:
            staged.wait()
        self.last_saved_step = step
        self._last_save_time = time.monotonic()
        self.last_save_s = time.perf_counter() - t0
        self.blocked_s.append(self.last_save_s)
        if self.tuner:
            self.tuner.pending = True

    def retune(self) -> dict[str, Any] | None:
        """storage.save_every_steps=auto, a step after a save (its stall is
        complete: the held optimizer step counted): the interval from the
        slowest rank's measured save and step time (one small gather, the
        same answer everywhere); the record of it for the run log."""
        if not self.tuner or not self.tuner.pending:
            return None
        figures = self._all_gather((self.last_save_s, self.tuner.step_s), self.ctl_pg)
        rec = self.tuner.retune(max(f[0] for f in figures), max(f[1] for f in figures))
        self.every_steps = self.tuner.steps
        return rec

    @property
    def upload_lag_s(self) -> float | None:
        """Commit-to-verified-upload seconds of the newest upload (None: none yet)."""
        return self.worker.upload_lag_s

    def _hold_optimizers(self, optims: list[Any], staged: threading.Event) -> None:
        # One pre-step hook per optimizer, registered once and never removed
        # (removing a hook from inside the hook loop breaks that loop when a
        # second hook follows): it waits for the staging in flight, if any.
        self._held = staged
        for opt in optims:
            if id(opt) not in self._hooked:
                opt.register_step_pre_hook(self._wait_for_staging)
                self._hooked.add(id(opt))

    def _wait_for_staging(self, *_: Any) -> None:
        staged, self._held = self._held, None
        if staged is None:
            return
        t0 = time.perf_counter()
        staged.wait()
        # The loop was blocked here too: count it against the save.
        self.blocked_s[-1] += time.perf_counter() - t0
        self.last_save_s = self.blocked_s[-1]

    def _stage_and_send(
        self, step: int, path: str, live: Any, extra: bytes, staged: threading.Event, error: str
    ) -> None:
        """Staging thread: copy into the shared buffers, release the loop,
        hand the step to the worker (new buffers first when they changed).
        A failed staging is handed over too, as its error."""
        skel = None
        try:
            if not error:
                skel = self._stage(live)
        except Exception as e:
            error = f"rank {self.rank}: staging failed: {type(e).__name__}: {e}"
        finally:
            staged.set()  # never leave the loop waiting, even on failure
        if not error and self._stager.version != self._sent_version:
            self.worker.send("buffers", self._stager.buffers)
            self._sent_version = self._stager.version
        self.worker.send("save", step, path, skel, extra, error)

    def _stage(self, live: Any) -> Any:
        device = torch.device(getattr(self.info, "device", "cpu"))
        if device.type != "cuda" or not torch.cuda.is_available():
            return self._stager.stage(live)
        # Copy on a side stream of this rank's GPU (this thread's current
        # device is not the main thread's), after the compute stream's pending
        # work, so device-to-host copies overlap the next step's kernels.
        with torch.cuda.device(device):
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.default_stream(device))
            with torch.cuda.stream(side):
                out = self._stager.stage(live)
            side.synchronize()
        return out

    def _wait_pending(self, timeout_s: float | None = None) -> bool:
        """Wait for the worker's outcome of the step in flight (False on
        timeout). A failed save is counted and logged (:meth:`_record`); a
        worker that died, cannot be handed the step, or made no progress for
        ``storage.worker_stall_timeout_s`` raises CheckpointError."""
        if self._pending is None:
            return True
        step = self._pending
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        assert self._staging is not None
        try:
            self._staging.result(timeout=timeout_s)
        except TimeoutError:
            return False
        except Exception as e:
            # The worker never got the step: its peers wait for it in the
            # save's collectives, so no later save can commit either.
            self._pending = None
            self._record(step, f"rank {self.rank}: handing the step to the checkpoint worker failed: {e}")
            raise CheckpointError(self._worker_gone(step, f"{type(e).__name__}: {e}")) from e
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                reply = self.worker.recv("committed", _WATCH_S if left is None else min(left, _WATCH_S))
            except RuntimeError as e:  # the worker died
                self._pending = None
                self._record(step, f"rank {self.rank}: {e}")
                raise CheckpointError(self._worker_gone(step, str(e))) from e
            if reply is not None:
                break
            idle = self.worker.idle_s
            if idle > self.storage.worker_stall_timeout_s:
                self._pending = None
                why = (
                    f"rank {self.rank}: the checkpoint worker made no progress for {idle:.0f} s "
                    f"(storage.worker_stall_timeout_s={self.storage.worker_stall_timeout_s:g})"
                )
                self._record(step, why)
                raise CheckpointError(f"checkpoint of step {step} failed: {why}; stopping the run")
            if left is not None and left <= 0:
                return False
        self._pending = None
        _, done_step, error = reply
        assert done_step == step, (done_step, step)
        self._record(step, error)
        return True

    def _worker_gone(self, step: int, why: str) -> str:
        proc = self.worker.proc
        if proc.is_alive():
            return f"checkpoint of step {step} failed: checkpoint worker (pid {proc.pid}): {why}"
        proc.join(5)
        return (
            f"checkpoint of step {step} failed: checkpoint worker (pid {proc.pid}) died, exit code "
            f"{proc.exitcode}" + ("" if "died" in why else f" ({why})")
        )

    def _record(self, step: int, error: str) -> None:
        """One save's outcome: counted, logged, written for ``meshrun status``
        and kept for :meth:`poll`."""
        if error:
            self.failed[step] = error
            self.failures_in_a_row += 1
            limit = self.storage.max_failed_saves
            log.error(
                "checkpoint: save of step %d FAILED, not committed (%d in a row, %d in all%s): %s",
                step,
                self.failures_in_a_row,
                len(self.failed),
                f"; the run stops at {limit} in a row" if limit else "",
                error,
            )
        else:
            self.committed.append(step)
            self.failures_in_a_row = 0
        self._outcomes.append((step, error))
        if self.rank == 0:
            self._write_status()

    def _write_status(self) -> None:
        last = max(self.failed, default=None)
        status = {
            "committed_step": self.committed[-1] if self.committed else None,
            "failed_saves": len(self.failed),
            "failed_in_a_row": self.failures_in_a_row,
            "max_failed_saves": self.storage.max_failed_saves,
            "last_failure": {"step": last, "error": self.failed[last]} if last is not None else None,
            "time": time.time(),
        }
        path = os.path.join(self.spec.run_dir, CHECKPOINT_STATUS_FILE)
        try:
            tmp = f"{path}.tmp{os.getpid()}"
            with open(tmp, "w") as f:
                json.dump(status, f)
            os.replace(tmp, path)
        except OSError as e:  # the run dir itself may be what fails
            log.error("checkpoint: cannot write %s: %s", path, e)

    def failing(self) -> bool:
        """This rank knows ``storage.max_failed_saves`` failures in a row."""
        limit = self.storage.max_failed_saves
        return bool(limit) and self.failures_in_a_row >= limit

    def stop_failing(self) -> None:
        """Some rank knows its saves keep failing (agreed by the loop): the
        outcome is the same on every rank, so wait for it here, then raise
        :class:`CheckpointError` with the cause on every rank."""
        if not self.failing() and self._pending is not None:
            self._wait_pending()
        self._stop_if_failing()
        raise CheckpointError(
            "another rank's checkpoint saves failed "
            f"{self.storage.max_failed_saves} times in a row (storage.max_failed_saves); stopping"
        )

    def _stop_if_failing(self) -> None:
        if self.failing():
            limit = self.storage.max_failed_saves
            last = max(self.failed)
            raise CheckpointError(
                f"{self.failures_in_a_row} checkpoint saves failed in a row (storage.max_failed_saves={limit}); "
                f"stopping rather than training on unprotected. Newest committed step: "
                f"{self.committed[-1] if self.committed else 'none in this run'}. "
                f"Last failure (step {last}): {self.failed[last]}"
            )

    def poll(self) -> list[tuple[int, str]]:
        """Outcomes known since the last call, without waiting: (step, "")
        for a commit, (step, cause) for a failed save. Raises CheckpointError
        when the worker is stuck or gone."""
        if self._pending is not None and self._staging is not None and self._staging.done():
            self._wait_pending(0.0)
        return self.drain()

    def drain(self) -> list[tuple[int, str]]:
        """Outcomes recorded since the last poll/drain (never raises)."""
        out, self._outcomes = self._outcomes, []
        return out

    # -- end -----------------------------------------------------------------
    def finalize(self, timeout_s: float | None = None) -> dict[str, Any]:
        """Wait for the pending save's commit, then (bounded) for uploads;
        log and return a report."""
        if timeout_s is None:
            timeout_s = 60.0 * self.storage.upload_timeout_min
            if self._preempted:
                # Slurm kills the job after the QOS grace time: leave it time to
                # exit and requeue; the next start finishes the upload.
                timeout_s = min(timeout_s, 0.5 * self.spec.cfg.qos.grace_time_s)
        t0 = time.monotonic()
        committed = self._wait_pending(timeout_s)
        last = self.last_saved_step
        report: dict[str, Any] = {
            "saves": len(self.blocked_s),
            "committed_steps": list(self.committed),
            "blocked_s_mean": sum(self.blocked_s) / len(self.blocked_s) if self.blocked_s else 0.0,
            "blocked_s_max": max(self.blocked_s, default=0.0),
            # The last save's outcome is known and it committed.
            "commit_done": committed and last not in self.failed,
            # ... and it failed (on this rank: its directory's manifest, or a peer's save).
            "commit_failed": committed and last in self.failed,
            "last_save_error": "" if committed else "its commit did not come in time",
            "failed_steps": dict(self.failed),
            "uploads_done": True,
            # What this finalize waited for at most (half the QOS grace after a preemption).
            "upload_wait_limit_s": timeout_s,
        }
        if committed and last in self.failed:
            report["last_save_error"] = self.failed[last]
        if committed and self.worker.started:  # a deferred worker never started had nothing to do
            # The worker waits (bounded) for its uploads and prunes.
            self.worker.send("finalize", max(0.0, timeout_s - (time.monotonic() - t0)))
            reply = self.worker.recv("report", max(5.0, timeout_s - (time.monotonic() - t0) + 30.0))
            if reply is not None:
                report.update(reply[1])
            else:
                report["uploads_done"] = False
        if self._uploads_here and not report["uploads_done"]:
            log.warning(
                "checkpoint: uploads still pending after %.0f s (steps %s); local copies kept in %s; "
                "the next start of this run uploads them",
                timeout_s,
                report.get("upload_pending", "?"),
                self.root,
            )
        if committed:
            self.worker.close()
        if self.rank == 0:
            log.info(
                "checkpoint: %d saves, loop blocked %.3f s mean / %.3f s max per save",
                report["saves"],
                report["blocked_s_mean"],
                report["blocked_s_max"],
            )
        self._executor.shutdown(wait=False)
        self.report = report
        return report

    def wait_uploads(self, timeout_s: float) -> bool:
        """Wait for the pending commit and this node's uploads (benchmarks, tests)."""
        self._wait_pending()
        if not self._uploads_here:
            return True
        self.worker.send("wait_uploads", timeout_s)
        reply = self.worker.recv("uploads", timeout_s + 30.0)
        return bool(reply and reply[1])
