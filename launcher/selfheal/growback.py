"""Grow back: re-admit a node a fault left out, once it proves healthy.

While the supervisor (launcher/selfheal/supervisor.py) trains at a shrunk layout
(a fault, no spare left: launcher/selfheal/restart.py), each node it left out
that Slurm still gives the job (not down, not removed from the allocation)
gets a **burn-in** every ``launcher.burnin_interval_s``: the preflight's
node checks (``python -m launcher.preflight --node``: GPUs, NVLink, IB,
scratch, RAM, S3) on it, then the preflight all-reduce over the node's
tasks (train/observe/preflight_comm.py, held to the intra-node figure),
two srun steps on that node alone, beside the training step. Each result is
a ``burnin`` event in ``faults.jsonl`` and a line of the bad-node ledger
(launcher/config/nodeledger.py). After ``launcher.burnin_passes`` passes in
a row the node is re-admitted: the ledger's clearing line, a ``grow_back``
event, and USR2 to the training step: the ranks save at their next step and
exit (75), and the supervisor restarts at the planned layout, resharding
the checkpoint back (a restart, not counted against
``launcher.max_restarts``). A failed burn-in starts the count again.

Not done here: choosing to requeue for a full allocation instead (when no
left-out node can come back): the run stays shrunk and says so.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from pathlib import Path

from launcher.config import nodeledger
from launcher.config.health import append_fault
from launcher.config.runfiles import ALLREDUCE_FILE
from launcher.selfheal.records import say
from launcher.selfheal.restart import left_out_held
from launcher.selfheal.state import SupervisorState
from launcher.selfheal.step import Attempt, StepLauncher, attempt_heartbeats
from launcher.slurm.nodestate import node_info

BURNIN_DIR = "preflight/burnin"  # under the run dir: one folder per burn-in
STEP_TIMEOUT_S = 300.0  # one burn-in srun step (node checks; all-reduce)


def task_prefix(srun: list[str]) -> tuple[list[str], str]:
    """(srun and its flags, the tasks' python) of the supervised srun line
    ``srun FLAGS... PY -u -m MODULE RUN_DIR`` (launcher/slurm/render.py)."""
    assert len(srun) >= 5 and srun[-4:-2] == ["-u", "-m"], srun
    return srun[:-5], srun[-5]


class GrowBack:
    """The burn-ins of one shrunk attempt, on a thread beside it. It reads
    the shared ``state`` (the job, its allocation, the stop flag) and takes a
    node back out of ``state.excluded``; its srun steps are ``launcher``'s
    line and environment, on one node."""

    def __init__(self, state: SupervisorState, attempt: Attempt, launcher: StepLauncher) -> None:
        self.state, self.a, self.launcher = state, attempt, launcher
        self.lc = state.cfg.launcher
        self.stop = threading.Event()
        self.proc: subprocess.Popen[str] | None = None
        self.passes: dict[str, int] = {}
        self.seq = 0
        self.thread = threading.Thread(target=self._loop, daemon=True)

    # --- which nodes -------------------------------------------------------
    def candidates(self) -> list[str]:
        """Left-out nodes the job still holds and Slurm calls healthy."""
        return left_out_held(self.state.job, self.state.alloc, self.state.excluded, self.a.nodes)

    # --- one burn-in -------------------------------------------------------
    def _run(self, cmd: list[str], env: dict[str, str]) -> int:
        self.proc = subprocess.Popen(cmd, env=env, text=True)
        try:
            return self.proc.wait(STEP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return 124
        finally:
            self.proc = None

    def burn_in(self, node: str) -> tuple[bool, str]:
        """The node checks, then the node's all-reduce: (passed, why)."""
        self.seq += 1
        st, launcher = self.state, self.launcher
        out = Path(st.run_dir) / BURNIN_DIR / f"{st.slurm_restart}.{self.a.tag}.{node}.{self.seq}"
        out.mkdir(parents=True, exist_ok=True)
        prefix, py = task_prefix(launcher.srun)
        env = launcher.env([node], 0, f"{self.a.tag}.burnin{self.seq}")
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
            env.pop(k, None)  # the step's ranks are Slurm's (SLURM_PROCID...)
        env["MASTER_ADDR"] = node_info(node).get("NodeAddr") or node
        if env.get("MASTER_PORT", "").isdigit():  # not the training step's port
            port = int(env["MASTER_PORT"])
            env["MASTER_PORT"] = str(20000 + (port - 20000 + 104729 + 31 * self.seq) % 20000)
        where = [f"--nodelist={node}", "--nodes=1"]
        checks = [
            prefix[0], *where, "--ntasks=1", "--ntasks-per-node=1", *prefix[1:],
            py, "-u", "-m", "launcher.preflight", "--node", st.run_dir, "--out", str(out),
        ]  # fmt: skip
        rc = self._run(checks, env)
        if self.stop.is_set():
            return False, "stopped"
        if rc:
            failed = _failed_checks(out / f"{node}.json")
            return False, f"node checks failed (exit {rc}): {failed or 'see the job log'}"
        comm = [
            prefix[0], *where, f"--ntasks={launcher.rpn}", f"--ntasks-per-node={launcher.rpn}", *prefix[1:],
            py, "-u", "-m", "train.observe.preflight_comm", st.run_dir, "--single-node", "--out", str(out),
        ]  # fmt: skip
        rc = self._run(comm, env)
        detail = _allreduce_detail(out / ALLREDUCE_FILE)
        if rc:
            return False, f"all-reduce failed (exit {rc}): {detail or 'see the job log'}"
        return True, f"node checks passed; all-reduce: {detail}"

    # --- the loop ------------------------------------------------------------
    def _loop(self) -> None:
        st, a = self.state, self.a
        while not self.stop.wait(self.lc.burnin_interval_s):
            if st.stopping is not None or a.proc is None or a.proc.poll() is not None:
                return
            for node in self.candidates():
                t0 = time.time()
                ok, detail = self.burn_in(node)
                if self.stop.is_set() or st.stopping is not None:
                    return
                self.passes[node] = self.passes.get(node, 0) + 1 if ok else 0
                cleared = self.passes[node] >= self.lc.burnin_passes
                self._record(node, ok, detail, t0, cleared)
                if cleared:
                    self._readmit(node)
                    return

    def _record(self, node: str, ok: bool, detail: str, t0: float, cleared: bool) -> None:
        st = self.state
        ev = {
            "event": "burnin",
            "job": st.job,
            "attempt": self.a.tag,
            "node": node,
            "result": "pass" if ok else "fail",
            "passes_in_a_row": self.passes[node],
            "of": self.lc.burnin_passes,
            "seconds": round(time.time() - t0, 2),
            "detail": detail[:300],
            "time": time.time(),
        }
        append_fault(st.run_dir, ev)
        rec = {
            "node": node,
            "burnin": ev["result"],
            "run": st.spec.run_id or st.run_dir,
            "run_dir": st.run_dir,
            "job": st.job,
            "detail": detail[:200],
        }
        if cleared:
            rec["cleared"] = True
        nodeledger.append_or_say(st.ledger, rec, say)
        say(
            f"burn-in of {node}: {ev['result'].upper()} ({self.passes[node]} of {self.lc.burnin_passes} in a row, "
            f"{ev['seconds']:g} s): {detail}"
        )

    def _readmit(self, node: str) -> None:
        """``node`` passed its burn-ins: back in, and the step stops at a checkpoint."""
        st, a = self.state, self.a
        hbs = attempt_heartbeats(st.run_dir, a.tag)
        step = max((int(h.get("step", 0)) for h in hbs.values()), default=0)
        now = time.time()
        st.excluded.pop(node, None)
        a.grow = {
            "event": "grow_back",
            "job": st.job,
            "attempt": a.tag,
            "cause": "grow_back",
            "node": node,
            "step": step,
            "fault_at": now,
            "detected_at": now,
            "time": now,
        }
        append_fault(st.run_dir, a.grow)
        say(
            f"grow back: {node} passed {self.lc.burnin_passes} burn-ins in a row: re-admitted; USR2 to attempt "
            f"{a.tag}: the ranks save and stop, then the run restarts at its planned layout"
        )
        if a.proc is not None and a.proc.poll() is None:
            a.proc.send_signal(signal.SIGUSR2)

    # --- lifetime ------------------------------------------------------------
    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
        self.thread.join(10)


def _failed_checks(path: Path) -> str:
    try:
        rep = json.loads(path.read_text())
        return "; ".join(f"{c['name']}: {c['detail']}" for c in rep["checks"] if c.get("status") == "fail")
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def _allreduce_detail(path: Path) -> str:
    try:
        return str(json.loads(path.read_text())["check"]["detail"])
    except (OSError, ValueError, KeyError, TypeError):
        return ""
