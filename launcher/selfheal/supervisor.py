"""Self-healing training steps: the batch-level supervisor of a Slurm run.

``python -m launcher.selfheal <run_dir> -- srun ... python -m train.loop.signals <run_dir>``
is the batch script's command (launcher/slurm/render.py) for training jobs.
It runs the srun step and, while it runs, watches each rank's heartbeat
(train/observe/heartbeat.py, launcher/config/health.py); after a failure it decides
which node it belongs to, records it, and starts the step again inside the
same allocation, without that node:

- **hang**: a rank whose heartbeat has not advanced for
  ``launcher.hang_timeout_s`` during steps (start-up, restore and save:
  ``launcher.hang_startup_timeout_s``; defaults from the measured step
  time: launcher/selfheal/hangwatch.py). The step is sent
  :data:`STACK_SIGNAL` (every rank's faulthandler writes all its threads'
  stacks to ``<run_dir>/stacks/``), then SIGKILL. Ranks that wrote no stack
  (a stopped process, a wedged node) are the ones blamed.
- **failure**: srun ends non-zero. The node is, in this order: a node Slurm
  reports down or failing, or removed from the job's allocation
  (``--no-kill`` keeps the job without it); then rank causes, in this
  order: the node of the first rank that recorded a real Python error
  (``failures.log``; any but a lost peer's connection error), unless ranks
  on two or more nodes raised the same error (then no node is blamed); the
  node srun names first with a task SIGKILLed or OOM-killed; when all errors
  are lost peers', the node they name (cause ``peer``:
  launcher/selfheal/attribution.py ``peer_fault``); a task SIGABRTed (a
  survivor's NCCL watchdog aborts it seconds after a peer's real error).
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
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from launcher.config import nodeledger, nodename
from launcher.config.health import (
    ATTEMPT_ENV,
    STACK_SIGNAL,
    STEP_PHASES,
    read_faults,
    read_heartbeats,
    stack_path,
)
from launcher.config.scriptjob import tasks_per_node
from launcher.config.secrets import without_secrets
from launcher.config.spec import PLAN_FILE_ENV, load_spec
from launcher.selfheal.attempt import Attempt
from launcher.selfheal.attribution import (
    SRUN_ERROR,
    failed_exit_line,
    first_cause,
    peer_fault_of,
    signalled_line,
    stop_exit_code,
)
from launcher.selfheal.growback import GrowBack
from launcher.selfheal.hangwatch import HangWatch, program_ended
from launcher.selfheal.restart import RestartPolicy, job_nodes, say
from launcher.selfheal.stragglerpolicy import StragglerPolicy
from launcher.slurm.nodestate import hostnames, node_bad_state, node_info, slurm_cmd
from launcher.views import goodputend

POLL_S = 1.0
# A script job's fault step: the furthest any rank reached, "done" ranks too
# (a team's program may report steps on rank 0 only).
REACHED_PHASES = (*STEP_PHASES, "done")
STACK_WAIT_S = 5.0  # time the ranks get to write their stacks
KILL_WAIT_S = 30.0  # srun's exit after SIGKILL of the step
FORWARD_WAIT_S = 30.0  # a stop is passed to tasks that wrote no heartbeat yet after this
REQUEUE_EXIT_CODE = 75  # launcher.slurm.render.REQUEUE_EXIT_CODE
# launcher.slurm.render.UNCOMMITTED_EXIT_CODE: stopped by a signal, final
# checkpoint not committed; the batch script decides, as for 75.
UNCOMMITTED_EXIT_CODE = 76
FAILURES_FILE = "failures.log"  # launcher.slurm.render.FAILURES_FILE
PORT_BASE, PORT_SPAN = 20000, 20000  # launcher.slurm.render


class Supervisor(RestartPolicy, StragglerPolicy):
    def __init__(self, run_dir: str, srun: list[str]) -> None:
        self.run_dir = run_dir
        self.srun = srun
        self.spec = load_spec(run_dir)
        self.cfg = self.spec.cfg
        self.reached = REACHED_PHASES if self.cfg.job.kind == "script" else STEP_PHASES
        self.job = os.environ.get("SLURM_JOB_ID", "")
        self.restart = os.environ.get("SLURM_RESTART_COUNT", "0") or "0"
        self.alloc = hostnames(os.environ.get("SLURM_JOB_NODELIST", ""))
        self.need = self.spec.plan.nodes
        # Tasks per node (job.launch=torchrun: one, forking the node's ranks).
        self.rpn = tasks_per_node(self.cfg.job.kind, self.cfg.job.launch, self.spec.plan.ranks_per_node)
        self.world = self.spec.plan.world_size
        self.plan, self.plan_env = self.spec.plan, {}
        self.hangs = HangWatch(self.spec, say)
        self.ledger = nodeledger.ledger_path(self.cfg)
        self.stopping: int | None = None
        self.earlier = read_faults(run_dir)
        # node -> why; nodes this start's preflight failed (launcher/nodecheck/nodepreflight.py --record) first.
        pre = f"{self.restart}.preflight"
        self.excluded = {
            f["node"]: "preflight"
            for f in self.earlier
            if (f.get("job"), f.get("attempt")) == (self.job, pre) and nodename.is_node_name(f.get("node"))
        }
        failure_requeues = int(os.environ.get("MESHRUN_FAILURE_RESTARTS", "0") or 0)
        # In-allocation restarts of this job before a requeue count as well.
        used = sum(1 for f in self.earlier if f.get("job") == self.job and f.get("action") == "restart")
        self.restarts_left = self.cfg.launcher.max_restarts - failure_requeues - used
        self.requeue_why = ""

    # --- signals: scancel / preemption reach this process too --------------
    def _on_signal(self, signum: int, frame: object) -> None:
        # The tasks checkpoint and exit; never start an attempt after this.
        # Only a flag here: run_attempt forwards it to an attempt's srun.
        if self.stopping is None:
            self.stopping = signum

    def stopped_before_start(self, tag: str) -> int:
        """A stop signal came before attempt ``tag`` started (during the last
        one's attribution or the restart work): it is not started. Exit as
        the stop path does: the batch script requeues (preemption, time
        limit) or ends the job (cancelled), and the run resumes from its
        newest committed checkpoint: no final save, hence 76."""
        assert self.stopping is not None
        say(
            f"stop signal {signal.Signals(self.stopping).name} before attempt {tag} started: not starting it "
            f"(exit {UNCOMMITTED_EXIT_CODE}: the work since the newest committed checkpoint is lost)"
        )
        return UNCOMMITTED_EXIT_CODE

    def _forward_stop(self, a: Attempt) -> None:
        """Give the stop to the attempt's tasks (srun passes USR2 on to them;
        a second one is harmless: train/loop/signals.py only sets a flag), once
        they can take it: they wrote a heartbeat (their handler is set
        before), or FORWARD_WAIT_S went by."""
        assert a.proc is not None and self.stopping is not None
        if a.forwarded or not (self._heartbeats(a) or time.time() - a.started > FORWARD_WAIT_S):
            return
        a.forwarded = True
        say(f"stop signal {signal.Signals(self.stopping).name}: passing USR2 to attempt {a.tag}")
        a.proc.send_signal(signal.SIGUSR2)  # nothing when it ended meanwhile

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGUSR2, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    # --- one attempt ------------------------------------------------------
    def _command(self, nodes: list[str]) -> list[str]:
        assert self.srun and Path(self.srun[0]).name == "srun", self.srun
        return [
            self.srun[0],
            f"--nodes={len(nodes)}",
            f"--ntasks={len(nodes) * self.rpn}",
            f"--ntasks-per-node={self.rpn}",
            f"--nodelist={','.join(nodes)}",
            *self.srun[1:],
        ]

    def _env(self, nodes: list[str], n: int, tag: str) -> dict[str, str]:
        env = task_env()
        env[ATTEMPT_ENV] = tag
        env.pop(PLAN_FILE_ENV, None)
        env.update(self.plan_env)  # a shrunk layout's plan file
        addr = node_info(nodes[0]).get("NodeAddr") or nodes[0]
        env["MASTER_ADDR"] = addr
        if not self.cfg.launcher.master_port and env.get("MASTER_PORT", "").isdigit():
            # A fresh rendezvous port per attempt: the last one's may linger.
            port = int(env["MASTER_PORT"])
            env["MASTER_PORT"] = str(PORT_BASE + (port - PORT_BASE + 7919 * n) % PORT_SPAN)
        return env

    def _tee(self, a: Attempt) -> None:
        assert a.proc is not None and a.proc.stderr is not None
        for line in a.proc.stderr:
            sys.stderr.write(line)
            sys.stderr.flush()
            if SRUN_ERROR.search(line):
                a.srun_errors.append((time.time(), line.strip()))

    def _heartbeats(self, a: Attempt) -> dict[int, dict[str, Any]]:
        return {r: h for r, h in read_heartbeats(self.run_dir).items() if h.get("attempt") == a.tag}

    def _step_id(self, a: Attempt) -> str | None:
        ids = {h.get("step_id") for h in self._heartbeats(a).values() if h.get("step_id")}
        if ids:
            return str(max(ids, key=int))
        out = slurm_cmd(["squeue", "-h", "-s", "-j", self.job, "-o", "%i"])
        steps = [s.split(".", 1)[1] for s in out.stdout.split() if "." in s and s.split(".", 1)[1].isdigit()]
        return max(steps, key=int) if steps else None

    def _end_hung_step(self, a: Attempt, stale: dict[int, dict[str, Any]]) -> None:
        detected = time.time()
        step_id = self._step_id(a)
        target = f"{self.job}.{step_id}" if step_id else None
        say(f"hang: rank(s) {sorted(stale)} silent past the limit ({stale}); dumping stacks of step {target}")
        sent = time.time()
        if target:
            slurm_cmd(["scancel", f"--signal={STACK_SIGNAL.name}", target])
        time.sleep(STACK_WAIT_S)
        stacks, silent = {}, []
        hbs = self._heartbeats(a)
        for r in range(self.world):
            p = stack_path(self.run_dir, a.tag, r)
            text = p.read_text() if p.exists() else ""
            if text.strip():
                stacks[r] = str(p)
            else:
                silent.append(r)
        nodes = sorted({hbs[r]["node"] for r in silent if r in hbs})
        a.hang = {
            "stale": stale,
            "unresponsive_ranks": silent,
            "unresponsive_nodes": nodes,
            "stacks": stacks,
            "signal_sent_at": sent,
            "detected_at": detected,
        }
        say(f"stacks from {len(stacks)} rank(s) in {Path(self.run_dir) / 'stacks'}; no answer from {silent}")
        if target:
            slurm_cmd(["scancel", "--signal=KILL", target])
        assert a.proc is not None
        try:
            a.proc.wait(KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            a.proc.kill()

    def run_attempt(self, nodes: list[str], n: int) -> tuple[Attempt, int]:
        tag = f"{self.restart}.{n}"
        a = Attempt(tag=tag, nodes=nodes, started=time.time())
        cmd = self._command(nodes)
        if self.stopping is not None:  # the last moment before the start
            return a, self.stopped_before_start(tag)
        say(f"attempt {tag}: {len(nodes)} node(s) {','.join(nodes)} (hang limits: {self.hangs.describe()})")
        a.proc = subprocess.Popen(cmd, env=self._env(nodes, n, tag), stderr=subprocess.PIPE, text=True)
        tee = threading.Thread(target=self._tee, args=(a,), daemon=True)
        tee.start()
        grow = self._grow_back(a)
        while a.proc.poll() is None:
            time.sleep(POLL_S)
            if self.stopping is not None:  # the tasks save and exit; no hang verdicts now
                self._forward_stop(a)  # a stop that came as it started (or to this process only)
                continue
            hbs = self._heartbeats(a)
            stale = self.hangs.stale(hbs, a.started, time.time())
            if stale:
                ended = program_ended(self.cfg.job.kind, self.world, self.run_dir, a.started, hbs, stale)
                self._end_hung_step(a, stale)
                if ended and a.hang is not None:
                    a.hang["program_ended"] = ended
                break
            self._watch_stragglers(a, hbs)
        rc = a.proc.wait()
        if grow is not None:
            grow.close()
        tee.join(5)
        self._drop_empty_stacks(a)
        return a, rc

    def _grow_back(self, a: Attempt) -> GrowBack | None:
        """Burn-ins of the nodes a shrunk attempt left out (launcher/selfheal/growback.py)."""
        if self.plan.nodes >= self.spec.plan.nodes:
            return None
        lc = self.cfg.launcher
        if not lc.grow_back:
            say("launcher.grow_back=false: the run stays at its shrunk layout")
            return None
        grow = GrowBack(self, a)
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

    def _drop_empty_stacks(self, a: Attempt) -> None:
        for r in range(self.world):
            p = stack_path(self.run_dir, a.tag, r)
            try:
                if p.exists() and p.stat().st_size == 0:
                    p.unlink()
            except OSError:
                pass

    # --- attribution ------------------------------------------------------
    def _python_errors(self, a: Attempt) -> list[tuple[float, int, str]]:
        """(time, rank, error) recorded by ranks during this attempt, oldest first."""
        path = Path(self.run_dir) / FAILURES_FILE
        out = []
        if path.exists():
            pat = re.compile(rf"^{re.escape(self.job or 'local')} \S+ rank (\d+) ([0-9.]+): (.*)$")
            for line in path.read_text().splitlines():
                m = pat.match(line)
                if m and float(m.group(2)) >= a.started - 1:
                    out.append((float(m.group(2)), int(m.group(1)), m.group(3)))
        return sorted(out)

    def attribute(self, a: Attempt, rc: int) -> dict[str, Any]:
        hbs = self._heartbeats(a)
        steps = [int(h["step"]) for h in hbs.values() if h.get("phase") in self.reached]
        fault: dict[str, Any] = {
            "job": self.job,
            "attempt": a.tag,
            "nodes": a.nodes,
            "srun_exit": rc,
            "started_at": a.started,
            "step": max(steps) if steps else 0,
        }
        errors = self._python_errors(a)
        down = {n: s for n in a.nodes if (s := node_bad_state(n))}
        now = job_nodes(self.job)  # Slurm removes a failed node from a --no-kill job
        for n in a.nodes:
            if now is not None and n not in now:
                down.setdefault(n, "removed from the job's allocation (node failure)")
        first_srun = a.srun_errors[0][1] if a.srun_errors else ""
        m = SRUN_ERROR.search(first_srun)
        if a.hang:
            nodes = a.hang["unresponsive_nodes"]
            stale = a.hang["stale"]
            fault.update(
                cause="hang",
                node=nodes[0] if len(nodes) == 1 else None,
                error=f"no progress for {max(s['silent_s'] for s in stale.values())} s in phase "
                f"{sorted({s['phase'] for s in stale.values()})}",
                step=max(s["step"] for s in stale.values()),
                fault_at=min(s["last_beat_at"] for s in stale.values()),  # progress stopped
                evidence=a.hang,
            )
            if len(nodes) > 1:
                fault["evidence"]["note"] = "several nodes did not answer: none blamed"
        elif down:
            node = sorted(down)[0]
            fault.update(
                cause="node_down", node=node, error=f"Slurm: {node} {down[node]}", evidence={"states": down}
            )
        # Rank causes: a real Python error > SIGKILL/OOM > the peer a connection error names > SIGABRT.
        elif (
            (sig := signalled_line(a.srun_errors, errors)) is None
            and errors
            and (peer := peer_fault_of(errors, hbs, a.nodes)) is not None
        ):
            fault.update(
                peer, step=int(hbs.get(peer["evidence"]["first_rank"], {}).get("step", fault["step"]))
            )
            fault["evidence"]["srun"] = first_srun
        elif sig is not None or (sig := signalled_line(a.srun_errors, errors, weak=True)) is not None:
            line = sig[1]
            node, tasks, what = SRUN_ERROR.search(line).groups()  # type: ignore[union-attr]
            fault.update(cause="signal", node=node, error=f"task {tasks}: {what}", evidence={"srun": line})
        elif errors:
            t, rank, err = first_cause(errors)
            same = {hbs.get(r, {}).get("node") for _, r, e in errors if e == err}
            node = hbs.get(rank, {}).get("node")
            everywhere = len(same - {None}) > 1
            fault.update(
                cause="error",
                node=None if everywhere else node,
                error=err,
                step=int(hbs.get(rank, {}).get("step", fault["step"])),
                evidence={
                    "first_rank": rank,
                    "ranks_with_this_error": sorted(r for _, r, e in errors if e == err),
                    "nodes_with_this_error": sorted(n for n in same if n),
                    "srun": first_srun,
                },
                fault_at=t,
            )
        else:
            node = m.group(1) if m else None
            fault.update(
                cause="exit",
                node=node,
                error=m.group(3) if m else f"srun exit {rc}",
                evidence={"srun": first_srun},
            )
        fault.setdefault("fault_at", a.srun_errors[0][0] if a.srun_errors else time.time())
        return fault

    def main(self) -> int:
        self.install()
        goodputend.keep_fresh(self.run_dir, goodputend.job_id_from_env() or self.job)
        n = 0
        watcher: tuple[threading.Thread, threading.Event] | None = None
        last_fault: dict[str, Any] | None = None
        resumed = {r.get("after_fault_attempt") for r in self.earlier if r.get("event") == "resumed"}
        requeued = [f for f in self.earlier if f.get("action") == "requeue" and f.get("job") == self.job]
        if requeued and requeued[-1]["attempt"] not in resumed:
            last_fault = requeued[-1]  # this start follows our own requeue: measure its cost too
        while True:
            if self.stopping is not None:  # came during the last attempt's attribution or restart work
                return self.stopped_before_start(f"{self.restart}.{n}")
            healthy = self.healthy()
            plan, why = self.layout_for(healthy)
            if plan is None or self.requeue_why:
                bad = sorted(set(self.alloc) - set(healthy))
                return self.requeue_without(
                    bad, self.requeue_why or (f"no smaller layout fits: {why}" if why else "")
                )
            self.use_plan(plan, f"{self.restart}.{n}")
            self.need, self.world = plan.nodes, plan.world_size
            self.hangs.world = plan.world_size
            nodes = healthy[: self.need]
            if last_fault is not None:
                a_next_tag = f"{self.restart}.{n}"
                stop = threading.Event()
                probe = Attempt(tag=a_next_tag, nodes=nodes, started=time.time())
                t = threading.Thread(target=self.watch_resume, args=(last_fault, probe, stop), daemon=True)
                t.start()
                watcher = (t, stop)
            a, rc = self.run_attempt(nodes, n)
            if watcher:
                watcher[1].set()
                watcher[0].join(2)
                watcher = None
            ours = a.replace or a.grow
            if (
                ours is not None
                and rc in (REQUEUE_EXIT_CODE, UNCOMMITTED_EXIT_CODE)
                and self.stopping is None
            ):
                # Our own stop (a straggler's replacement, a node grown back):
                # restart at once, not a restart used up.
                say(
                    f"attempt {a.tag} stopped at a checkpoint (exit {rc}): restarting "
                    + (f"without {ours['node']}" if a.replace else f"with {ours['node']} back")
                )
                last_fault = ours
                n += 1
                continue
            stop_codes = (REQUEUE_EXIT_CODE, UNCOMMITTED_EXIT_CODE)
            if rc in stop_codes and self.stopping is None and failed_exit_line(a.srun_errors, stop_codes):
                # srun's exit is its tasks' highest: one task's real failure
                # under the others' stop after srun's SIGTERM. A failure.
                rc = 1
            if rc not in (0, *stop_codes) and self.stopping is None and a.hang is None:
                code = stop_exit_code(a.srun_errors, stop_codes)
                if code is not None:  # stopped by a signal to the steps alone (the time limit's USR2)
                    say(f"attempt {a.tag}: every task stopped for requeue (srun exit {rc}): exit {code}")
                    rc = code
            if rc in (0, *stop_codes) or self.stopping is not None:
                return rc
            fault = self.attribute(a, rc)
            fault["detected_at"] = a.hang["detected_at"] if a.hang else time.time()
            if a.hang and a.hang.get("program_ended"):
                # Counted as a fault (no node blamed), not restarted: the training is done.
                fault.update(node=None, action="end: completed", error=a.hang["program_ended"])
                self.record(fault)
                say(f"attempt {a.tag}: {fault['error']} within the limit: ended them, the run is complete")
                return 0
            code = self.after_fault(fault, rc)
            if code is not None:
                return code
            last_fault = fault
            n += 1


def task_env() -> dict[str, str]:
    """The tasks' environment: the batch's, with its own PYTHONPATH back (the
    supervisor's is the host code dir; in a container the tasks need theirs),
    less any credential (srun would store it in the step; docs/security.md)."""
    env = without_secrets(os.environ)
    if "MESHRUN_TASK_PYTHONPATH" in env:
        env["PYTHONPATH"] = env.pop("MESHRUN_TASK_PYTHONPATH")
    return env


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
        if not sup.alloc:
            raise RuntimeError(
                f"scontrol did not expand SLURM_JOB_NODELIST={os.environ.get('SLURM_JOB_NODELIST')!r}"
            )
    except Exception as e:  # never keep a run from training: one plain srun, no restarts
        say(f"cannot supervise ({type(e).__name__}: {e}): one srun, no restart inside the allocation")
        return subprocess.call(srun, env=task_env())
    return sup.main()
