"""Self-healing training steps: the batch-level supervisor of a Slurm run.

``python -m launcher.selfheal <run_dir> -- srun ... python -m train <run_dir>``
is the batch script's command (launcher/slurm/render.py) for training jobs.
It runs the srun step and, while it runs, watches each rank's heartbeat
(train/observe/heartbeat.py, launcher/config/health.py); after a failure it decides
which node it belongs to, records it, and starts the step again inside the
same allocation, without that node:

- **hang**: a rank whose heartbeat has not advanced for
  ``launcher.hang_timeout_s`` during steps (start-up, restore and save:
  ``launcher.hang_startup_timeout_s``; defaults from the measured step
  time: launcher/selfheal/hangwatch.py). The step is sent
  (launcher/selfheal/hangend.py)
  :data:`STACK_SIGNAL` (every rank's faulthandler writes all its threads'
  stacks to ``<run_dir>/stacks/``), then SIGKILL. Ranks that wrote no stack
  (a stopped process, a wedged node) are the ones blamed.
- **failure**: srun ends non-zero. The node is, in this order: a node Slurm
  reports down or failing, or removed from the job's allocation
  (``--no-kill`` keeps the job without it); a job=script wrapper's own
  failure before its program started (cause ``wrapper``: the run's error,
  no node); then rank causes, in this order: the node of the first rank that recorded a real Python error
  (``failures.log``; any but a lost peer's connection error), unless ranks
  on two or more nodes raised the same error (then no node is blamed); the
  node srun names first with a task SIGKILLed or OOM-killed; when all errors
  are lost peers', the node they name (cause ``peer``:
  launcher/selfheal/attribution.py ``peer_fault``); a task SIGABRTed (a
  survivor's NCCL watchdog aborts it seconds after a peer's real error).
  launcher/selfheal/evidence.py gathers what is known, and
  launcher/selfheal/attribution.py ``attribute`` (a pure function) decides.
- each fault is a line of ``<run_dir>/faults.jsonl`` (cause, node, step,
  evidence, action) and, when a node is blamed, of the runs root's
  bad-node ledger (launcher/config/nodeledger.py).
- **the code's bug**: a fault with the same error at the same step as an
  earlier one of this run, on another node (or blamed on none): stop, say
  so, and take the node lines back out of the ledger.
- **restart**: on the plan's number of nodes picked from the allocation's
  healthy ones, not those this start's preflight failed (``cluster.spare_nodes``
  extra nodes are allocated for this),
  with a fresh rendezvous on the first of them; each restart resumes from the
  newest committed checkpoint (the trainer's own resume). When too few
  healthy nodes remain, on those at a smaller data-parallel degree when the
  plan allows one, else the job is requeued with the bad ones in its
  ``ExcNodeList`` (launcher/selfheal/restart.py: what follows a fault, the
  records, the ledger). Restarts and such requeues together are bounded by
  ``launcher.max_restarts``; preemption and time-limit requeues (exit 75,
  handled by the batch script) are not faults.
- **in-process recovery** (``launcher.in_process_recovery``, meshrun's
  trainer): a dead task is not a failed attempt; the step goes on and one
  replacement task takes its rank (launcher/selfheal/inprocess.py); only
  what that path cannot handle reaches the restart above.

Why not nvidia-resiliency-ext's ``ft_launcher``: it is a torchrun-style
agent that forks the ranks itself on every node; meshrun's tasks are srun's
(one task per GPU, Slurm owns their lifetime and signals), and the batch
script is the one process that sees the whole allocation, so the watch,
the attribution and the restart live there, with Slurm's own tools
(``scancel --signal``, ``--nodelist``, ``ExcNodeList``). torch elastic
(torchrun's agent) has the same shape (an agent per node that owns the
ranks) and restarts every rank on any failure without a memory of nodes.
torchft heals per step without a restart, but needs its lighthouse server
and replica groups that each own a full model copy (HSDP-style), an extra
service and a model change; meshrun restarts from the newest committed
checkpoint, which its async tiered saves make cheap (seconds, measured in
tests/cluster/test_selfheal.py), and works for every layout it trains.

The parts, each a plain object sharing one explicit state
(launcher/selfheal/state.py ``SupervisorState``): the step's command and
environment (step.py), the hang limits (hangwatch.py) and what follows a
hang (hangend.py), the records (records.py), the restart policy
(restart.py), the straggler policy (stragglerpolicy.py) and grow back
(growback.py).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from launcher.config.runfiles import REQUEUE_EXIT_CODE, RESULT_FILE, UNCOMMITTED_EXIT_CODE
from launcher.selfheal import attribution, evidence, hangend, inprocess
from launcher.selfheal.attribution import SRUN_ERROR, failed_exit_line, stop_exit_code
from launcher.selfheal.growback import GrowBack
from launcher.selfheal.hangwatch import HangWatch, completed_since
from launcher.selfheal.inprocess import InProcessAttempt
from launcher.selfheal.records import FaultRecords, say
from launcher.selfheal.restart import RestartPolicy, healthy_nodes, layout_for
from launcher.selfheal.state import SupervisorState
from launcher.selfheal.step import Attempt, StepLauncher, attempt_heartbeats, task_env
from launcher.selfheal.stragglerpolicy import StragglerPolicy
from launcher.views import goodputend

POLL_S = 1.0
KILL_POLL_S = 0.1
CLOCK_SLACK_S = 30.0  # result.json's mtime is the shared filesystem's clock, not ours
FORWARD_WAIT_S = 30.0  # a stop is passed to tasks that wrote no heartbeat yet after this
# launcher.slurm.render.UNCOMMITTED_EXIT_CODE: stopped by a signal, final
# checkpoint not committed; the batch script decides, as for 75.
STOP_CODES = (REQUEUE_EXIT_CODE, UNCOMMITTED_EXIT_CODE)


class Supervisor:
    """The attempts of one batch job, and what follows each."""

    def __init__(self, run_dir: str, srun: list[str]) -> None:
        self.state = SupervisorState.from_env(run_dir)
        self.launcher = StepLauncher(self.state, srun)
        self.hangs = HangWatch(self.state.spec, say)
        self.records = FaultRecords(self.state)
        self.restarts = RestartPolicy(self.state, self.records)
        self.stragglers = StragglerPolicy(self.state, self.records)

    # --- signals: scancel / preemption reach this process too --------------
    def _on_signal(self, signum: int, frame: object) -> None:
        # The tasks checkpoint and exit; never start an attempt after this.
        # Only a flag here: run_attempt forwards it to an attempt's srun.
        if self.state.stopping is None:
            self.state.stopping = signum

    def stopped_before_start(self, tag: str) -> int:
        """A stop signal came before attempt ``tag`` started (during the last
        one's attribution or the restart work): it is not started. Exit as
        the stop path does: the batch script requeues (preemption, time
        limit) or ends the job (cancelled), and the run resumes from its
        newest committed checkpoint: no final save, hence 76."""
        assert self.state.stopping is not None
        say(
            f"stop signal {signal.Signals(self.state.stopping).name} before attempt {tag} started: not starting it "
            f"(exit {UNCOMMITTED_EXIT_CODE}: the work since the newest committed checkpoint is lost)"
        )
        return UNCOMMITTED_EXIT_CODE

    def _forward_stop(self, a: Attempt) -> None:
        """Give the stop to the attempt's tasks (srun passes USR2 on to them;
        a second one is harmless: train/loop/signals.py only sets a flag), once
        they can take it: they wrote a heartbeat (their handler is set
        before), or FORWARD_WAIT_S went by."""
        assert a.proc is not None and self.state.stopping is not None
        if a.forwarded:
            return
        if not (attempt_heartbeats(self.state.run_dir, a.tag) or time.time() - a.started > FORWARD_WAIT_S):
            return
        a.forwarded = True
        say(f"stop signal {signal.Signals(self.state.stopping).name}: passing USR2 to attempt {a.tag}")
        a.proc.send_signal(signal.SIGUSR2)  # nothing when it ended meanwhile

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGUSR2, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    # --- one attempt ------------------------------------------------------
    def _tee(self, a: Attempt) -> None:
        assert a.proc is not None and a.proc.stderr is not None
        for line in a.proc.stderr:
            sys.stderr.write(line)
            sys.stderr.flush()
            if SRUN_ERROR.search(line):
                a.srun_errors.append((time.time(), line.strip()))
                a.wake.set()

    def run_attempt(self, nodes: list[str], n: int) -> tuple[Attempt, int]:
        st = self.state
        tag = f"{st.slurm_restart}.{n}"
        a = Attempt(tag=tag, nodes=nodes, started=time.time())
        cmd = self.launcher.command(nodes)
        if st.stopping is not None:  # the last moment before the start
            return a, self.stopped_before_start(tag)
        env = self.launcher.env(nodes, n, tag)
        inproc = self._in_process(a, n, env)
        if inproc is not None:
            cmd = [cmd[0], *inprocess.kill_on_bad_exit_off(cmd[1:-5]), *cmd[-5:]]
        say(f"attempt {tag}: {len(nodes)} node(s) {','.join(nodes)} (hang limits: {self.hangs.describe()})")
        a.proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
        tee = threading.Thread(target=self._tee, args=(a,), daemon=True)
        tee.start()
        grow = self._grow_back(a)
        while a.proc.poll() is None or (inproc is not None and inproc.running()):
            # In-process recovery acts on a death or a missing rank at once,
            # and follows a kill step closely; otherwise a poll a second.
            a.wake.wait(KILL_POLL_S if inproc is not None and inproc.kills else POLL_S)
            a.wake.clear()
            if inproc is not None:  # a dead task's replacement (launcher.in_process_recovery)
                inproc.watch(replace=a.proc.poll() is None)  # none once the survivors ended
            if st.stopping is not None:  # the tasks save and exit; no hang verdicts now
                self._forward_stop(a)  # a stop that came as it started (or to this process only)
                continue
            hbs = attempt_heartbeats(st.run_dir, a.tag)
            stale = self.hangs.stale(hbs, a.started, time.time())
            if stale:
                hangend.end_hung_step(st, a, hbs, stale)
                if inproc is not None:
                    inproc.give_up("a hang")
                break
            self.stragglers.watch(a, hbs)
        rc = a.proc.wait()
        if grow is not None:
            grow.close()
        tee.join(5)
        if inproc is not None:
            inproc.watch(replace=False)  # the main step's last words
            rc = inproc.exit_code(rc)
            inproc.close()
        hangend.drop_empty_stacks(st, a)
        return a, rc

    def _in_process(self, a: Attempt, n: int, env: dict[str, str]) -> InProcessAttempt | None:
        """launcher.in_process_recovery: the attempt's store step, its address in ``env``."""
        if not inprocess.enabled(self.state):
            return None
        inproc = InProcessAttempt(self.state, self.launcher, a, n)
        try:
            env.update(inproc.start_store())
            inproc.start_spares()
        except (RuntimeError, OSError) as e:
            say(f"attempt {a.tag}: in-process recovery off for this attempt ({e}): a fault restarts the step")
            return None
        return inproc

    def _grow_back(self, a: Attempt) -> GrowBack | None:
        """Burn-ins of the nodes a shrunk attempt left out (launcher/selfheal/growback.py)."""
        st = self.state
        if st.plan.nodes >= st.spec.plan.nodes:
            return None
        lc = st.cfg.launcher
        if not lc.grow_back:
            say("launcher.grow_back=false: the run stays at its shrunk layout")
            return None
        grow = GrowBack(st, a, self.launcher)
        left_out = grow.candidates()
        if not left_out:
            say("grow back: no left-out node that the job still holds: the run stays at its shrunk layout")
            return None
        say(
            f"grow back: burn-ins of {','.join(left_out)} every {lc.burnin_interval_s:g} s; "
            f"re-admitted after {lc.burnin_passes} passes in a row"
        )
        grow.start()
        return grow

    # --- after an attempt -------------------------------------------------
    def attribute(self, a: Attempt, rc: int) -> dict[str, Any]:
        """The fault of a failed attempt: its evidence gathered, then the rule."""
        return attribution.attribute(evidence.gather(self.state, a, rc))

    def _exit_code(self, a: Attempt, rc: int) -> int:
        """srun's ``rc`` read as the batch script must see it: a real failure
        hidden under the others' stop codes is one (1); tasks that all
        stopped for a signal the batch shell never got are a stop."""
        if rc in STOP_CODES and self.state.stopping is None and failed_exit_line(a.srun_errors, STOP_CODES):
            # srun's exit is its tasks' highest: one task's real failure
            # under the others' stop after srun's SIGTERM. A failure.
            rc = 1
        if rc not in (0, *STOP_CODES) and self.state.stopping is None and a.hang is None:
            code = stop_exit_code(a.srun_errors, STOP_CODES)
            if code is not None:  # stopped by a signal to the steps alone (the time limit's USR2)
                say(f"attempt {a.tag}: every task stopped for requeue (srun exit {rc}): exit {code}")
                rc = code
        return rc

    def _watch_resume(
        self, last_fault: dict[str, Any], tag: str, nodes: list[str]
    ) -> tuple[threading.Thread, threading.Event]:
        """The restarted attempt's resume cost, measured on a thread beside it."""
        stop = threading.Event()
        probe = Attempt(tag=tag, nodes=nodes, started=time.time())
        t = threading.Thread(target=self.restarts.watch_resume, args=(last_fault, probe, stop), daemon=True)
        t.start()
        return t, stop

    def _last_requeue(self) -> dict[str, Any] | None:
        """This job's own requeue that no start has measured yet: this start follows it."""
        st = self.state
        resumed = {r.get("after_fault_attempt") for r in st.earlier if r.get("event") == "resumed"}
        requeued = [f for f in st.earlier if f.get("action") == "requeue" and f.get("job") == st.job]
        return requeued[-1] if requeued and requeued[-1]["attempt"] not in resumed else None

    def main(self) -> int:
        st = self.state
        self.install()
        goodputend.keep_fresh(st.run_dir, goodputend.job_id_from_env() or st.job)
        n = 0
        last_fault = self._last_requeue()  # measure our own requeue's cost too
        while True:
            if st.stopping is not None:  # came during the last attempt's attribution or restart work
                return self.stopped_before_start(f"{st.slurm_restart}.{n}")
            healthy = healthy_nodes(st)
            plan, why = layout_for(st.spec, healthy)
            if plan is None or st.requeue_why:
                bad = sorted(set(st.alloc) - set(healthy))
                return self.restarts.requeue_without(
                    bad, st.requeue_why or (f"no smaller layout fits: {why}" if why else "")
                )
            self.restarts.use_plan(plan, f"{st.slurm_restart}.{n}")
            self.hangs.world = plan.world_size
            nodes = healthy[: plan.nodes]
            watcher = None
            if last_fault is not None:
                watcher = self._watch_resume(last_fault, f"{st.slurm_restart}.{n}", nodes)
            a, rc = self.run_attempt(nodes, n)
            if watcher:
                watcher[1].set()
                watcher[0].join(2)
            ours = a.replace or a.grow
            if ours is not None and rc in STOP_CODES and st.stopping is None:
                # Our own stop (a straggler's replacement, a node grown back):
                # restart at once, not a restart used up.
                say(
                    f"attempt {a.tag} stopped at a checkpoint (exit {rc}): restarting "
                    + (f"without {ours['node']}" if a.replace else f"with {ours['node']} back")
                )
                last_fault = ours
                n += 1
                continue
            rc = self._exit_code(a, rc)
            if rc == 0 and st.stopping is None and not completed_since(st.run_dir, a.started - CLOCK_SLACK_S):
                # srun's 0 with no task's word that it completed (a step lost to a
                # node failure before its tasks ran): a failure, never a COMPLETED job.
                say(f"attempt {a.tag}: srun exited 0 but rank 0 wrote no completed {RESULT_FILE}: a failure")
                rc = 1
            if rc in (0, *STOP_CODES) or st.stopping is not None:
                return rc
            fault = self.attribute(a, rc)
            fault["detected_at"] = a.hang["detected_at"] if a.hang else time.time()
            if a.hang and a.hang.get("program_ended"):
                # Counted as a fault (no node blamed), not restarted: the training is done.
                fault.update(node=None, action="end: completed", error=a.hang["program_ended"])
                self.records.record(fault)
                hangend.note_ended(st.run_dir, a.hang)
                say(f"attempt {a.tag}: {fault['error']} within the limit: ended them, the run is complete")
                return 0
            code = self.restarts.after_fault(fault, rc)
            if code is not None:
                return code
            last_fault = fault
            n += 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("usage: python -m launcher.selfheal RUN_DIR -- srun ... ", file=sys.stderr)
        return 2
    i = argv.index("--")
    ap = argparse.ArgumentParser(prog="python -m launcher.selfheal")
    ap.add_argument("run_dir")
    args = ap.parse_args(argv[:i])
    srun = argv[i + 1 :]
    try:
        sup = Supervisor(args.run_dir, srun)
        if not sup.state.alloc:
            raise RuntimeError(
                f"scontrol did not expand SLURM_JOB_NODELIST={os.environ.get('SLURM_JOB_NODELIST')!r}"
            )
    except Exception as e:  # never keep a run from training: one plain srun, no restarts
        say(f"cannot supervise ({type(e).__name__}: {e}): one srun, no restart inside the allocation")
        return subprocess.call(srun, env=task_env())
    return sup.main()
