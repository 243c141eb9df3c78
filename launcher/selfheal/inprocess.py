"""In-process recovery on Slurm (launcher.in_process_recovery): what the
supervisor (launcher/selfheal/supervisor.py) adds to an attempt of
meshrun's trainer.

- **The store host**: ``python -m train.inprocess.storehost`` (the TCPStore
  the ranks' generations meet on, train/inprocess/rendezvous.py) as its own
  one-task srun step on the attempt's first node, ``--overlap`` beside the
  training step. A step rather than a process of the supervisor: it runs
  with the tasks' own interpreter and container flags (a Pyxis container's
  torch, which the batch host may lack), it outlives any rank, and Slurm
  ends it with the job. Its ``port N`` line is read here; its stdin closing
  at the attempt's end ends it. One per attempt: a restart's fresh ranks
  must not meet an earlier attempt's generations.
- **The training step** runs with ``--kill-on-bad-exit=0`` (one task's death
  leaves the step and the survivors running) and the store's address in
  every task's environment.
- **A replacement** for each task srun reports dead (``srun: error: NODE:
  task R: Killed``), while the step goes on: a one-task step ``--overlap``
  on a held spare node (one no other task of the attempt uses), else on
  the dead task's node (rank 0 always: its node's address is the
  survivors' ``MASTER_ADDR``), with the rank's identity (``RANK``, ``WORLD_SIZE``,
  ``LOCAL_RANK``, ``GROUP_RANK``: they win over the one-task step's
  ``SLURM_PROCID``, train/parallel/dist.py) and its incarnation of the rank
  (``MESHRUN_REPLACEMENT=<n>``, launcher/config/warmspare.py).
  A replacement that dies is replaced the same way; at most
  ``launcher.max_replacements`` in an attempt. The trainer records each
  recovery itself (faults.jsonl, rank 0); the supervisor records none.
- **A warm spare** (``launcher.warm_spare``) on each held spare node: a
  one-task step of the trainer that loaded torch and the trainer before any
  fault and waits on its input; a replacement bound for that node is the
  spare, given its rank by one line (launcher/config/warmspare.py), not a
  new step. A taken spare's successor starts on the node the lost task
  left once the rank it took trains: a later fault there is warm too.
- **A hung rank** (alive, never leaving its step): the survivors' bounded
  collectives time out and they move to the next generation; the store
  host names the rank that neither left nor arrived within a collective
  timeout (``missing G R`` on its output, train/inprocess/storehost.py).
  Its process (node and pid from its heartbeat) is SIGKILLed by a one-task
  step on its node, and srun's word of that death starts its replacement.
  A kill step that fails is said and tried again (KILL_TRIES), then the
  attempt ends.
- **Giving up**: a death past that bound, or a stop code mixed with deaths,
  ends every step of the attempt; the attempt's failure then takes the
  supervisor's restart path (attribution from the same srun lines).
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field

from launcher.config.health import STEP_PHASES, read_heartbeats
from launcher.config.nodename import is_node_name
from launcher.config.runfiles import REQUEUE_EXIT_CODE, UNCOMMITTED_EXIT_CODE
from launcher.config.warmspare import REPLACEMENT_ENV, assignment
from launcher.run.localrecovery import (
    RECOVERY_STORE_ENV,
    StoreChannel,
    spare_env,
)
from launcher.selfheal.attribution import SRUN_ERROR
from launcher.selfheal.records import say
from launcher.selfheal.restart import healthy_nodes
from launcher.selfheal.state import SupervisorState
from launcher.selfheal.step import Attempt, StepLauncher
from launcher.slurm.nodestate import node_info, slurm_cmd

STORE_START_S = 180.0  # the store step's start: srun, a container, torch's import on a busy node
STOP_CODES = (REQUEUE_EXIT_CODE, UNCOMMITTED_EXIT_CODE)
EXIT_CODE = re.compile(r"Exited with exit code (\d+)")
IO_FLAGS = ("--output", "--error", "--input")  # followed by a value


def enabled(state: SupervisorState) -> bool:
    """launcher.in_process_recovery for meshrun's trainer (launcher/plan/make.py refuses the rest)."""
    cfg = state.cfg
    return cfg.launcher.in_process_recovery and cfg.job.kind in ("pretrain", "finetune")


def task_ids(spec: str) -> list[int]:
    """srun's task list ("1", "0-2", "0,3") as ranks."""
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def dead_tasks(line: str) -> tuple[str, list[int], int | None] | None:
    """(node, ranks, exit code or None for a signal) of one srun error line; None: not a task's end."""
    m = SRUN_ERROR.search(line)
    if not m:
        return None
    code = EXIT_CODE.search(m.group(3))
    return m.group(1), task_ids(m.group(2)), int(code.group(1)) if code else None


def kill_on_bad_exit_off(flags: list[str]) -> list[str]:
    """srun flags with ``--kill-on-bad-exit=0``: one task's death ends no step."""
    out = [f for f in flags if not f.startswith(("--kill-on-bad-exit", "-K"))]
    return [*out, "--kill-on-bad-exit=0"]


def without_io(flags: list[str]) -> list[str]:
    """srun flags less the output files (the store step's ``port`` line comes to the supervisor)."""
    out, skip = [], False
    for f in flags:
        if skip:
            skip = False
        elif f in IO_FLAGS:
            skip = True
        elif not f.startswith(tuple(x + "=" for x in IO_FLAGS)) and f != "--open-mode=append":
            out.append(f)
    return out


class StoreStep:
    """The store host's srun step: started, its address read, ended."""

    def __init__(self, cmd: list[str], env: dict[str, str], node: str, wake: threading.Event) -> None:
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: lines.put(self._first_line()), daemon=True).start()
        try:
            line = lines.get(timeout=STORE_START_S)
        except queue.Empty:
            line = ""
        if not line.startswith("port "):
            self.stop()
            raise RuntimeError(f"the store host step did not start on {node} (it said {line.strip()!r})")
        host = node_info(node).get("NodeAddr") or node
        self.address = f"{host}:{int(line.split()[1])}"
        self.channel = StoreChannel(self.proc, wake)

    def _first_line(self) -> str:
        return self.proc.stdout.readline() if self.proc.stdout else ""

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            if self.proc.stdin:
                self.proc.stdin.close()  # the store host's signal to exit
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)


KILL_TRIES = 3  # kill steps for one hung rank before the attempt ends
KILLED, GONE = 0, 3  # a kill step's exits: the process killed; none there


@dataclass
class Replacement:
    rank: int
    node: str
    proc: subprocess.Popen[str]
    started: float = field(default_factory=time.time)
    handled: bool = False  # its death was acted on


@dataclass
class Kill:
    """A one-task step that SIGKILLs a hung rank's process."""

    rank: int
    gen: int
    pid: int
    node: str
    proc: subprocess.Popen[bytes]
    tries: int = 1
    issued: float = field(default_factory=time.time)


class InProcessAttempt:
    """One attempt's store step, replacements and verdict."""

    def __init__(self, state: SupervisorState, launcher: StepLauncher, a: Attempt, n: int) -> None:
        self.state, self.launcher, self.a, self.n = state, launcher, a, n
        self.left = state.cfg.launcher.max_replacements
        self.store: StoreStep | None = None
        self.seen = 0  # srun error lines of the main step read so far
        self.current: dict[int, Replacement] = {}  # rank -> its newest replacement
        self.incarnations: dict[int, int] = {}  # rank -> its newest process's (0: the main step's)
        self.ended: dict[int, int | None] = {}  # rank -> its exit code (None: a signal)
        self.gave_up = ""
        self.forwarded = False
        self.kills: list[Kill] = []  # the steps that kill hung ranks
        self.spares: dict[str, subprocess.Popen[str]] = {}  # node -> its warm spare's step
        self.refill: tuple[str, int] | None = None  # (node, the rank a spare took): the next warm spare

    # --- the store and the main step --------------------------------------
    def start_store(self) -> dict[str, str]:
        """The store step on the attempt's first node; the tasks' environment for it."""
        srun, node = self.launcher.srun, self.a.nodes[0]
        cmd = [srun[0], "--overlap", f"--nodelist={node}", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1"]
        cmd += without_io(kill_on_bad_exit_off(srun[1:-5]))
        cmd += [srun[-5], "-u", "-m", "train.inprocess.storehost"]
        self.store = StoreStep(cmd, self.launcher.env(self.a.nodes, self.n, self.a.tag), node, self.a.wake)
        say(
            f"attempt {self.a.tag}: in-process recovery on: store host {self.store.address} (a step on {node})"
        )
        return {RECOVERY_STORE_ENV: self.store.address}

    def start_spares(self) -> None:
        """A warm spare (launcher.warm_spare) on each held spare node: a
        one-task step of the trainer with no rank yet, which loads torch and
        waits on its input (srun forwards the supervisor's pipe) for the
        rank it takes (launcher/config/warmspare.py). Its output goes to
        ``<job>_spare-<node>_log.*`` until then."""
        if not self.state.cfg.launcher.warm_spare:
            return
        for node in [x for x in healthy_nodes(self.state) if x not in self.a.nodes]:
            self._start_spare(node)
        if self.spares:
            say(f"attempt {self.a.tag}: warm spare(s) on {','.join(self.spares)}")

    def _start_spare(self, node: str) -> None:
        srun = self.launcher.srun
        flags = [f.replace("%t", f"spare-{node}") for f in kill_on_bad_exit_off(srun[1:-5])]
        cmd = [srun[0], "--overlap", f"--nodelist={node}", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1"]
        assert self.store is not None
        env = spare_env(self.launcher.env(self.a.nodes, self.n, self.a.tag), self.store.address)
        self.spares[node] = subprocess.Popen([*cmd, *flags, *srun[-5:]], env=env, stdin=subprocess.PIPE,
                                             text=True)  # fmt: skip

    def _refill(self) -> None:
        """A taken spare's successor: a new warm spare on the node the lost
        task left (its process died; the node is still the job's and
        healthy), once the rank the spare took has trained (its heartbeat:
        a step begun after its first, which is the recovery's), so its
        start-up never competes with that recovery; a later fault there is
        warm too."""
        if self.refill is None:
            return
        node, rank = self.refill
        r = self.current.get(rank)
        if r is not None and r.proc.poll() is None:
            hb = read_heartbeats(self.state.run_dir).get(rank) or {}
            if hb.get("phase") != "step" or float(hb.get("time", 0)) < r.started:
                return  # still recovering
        self.refill = None
        if node in self.spares or node not in healthy_nodes(self.state):
            return
        self._start_spare(node)
        say(f"attempt {self.a.tag}: a warm spare on {node} again")

    def _outputs(self, rank: int) -> dict[str, str]:
        """The rank's own output files (srun's ``--output``/``--error`` patterns
        for task ``rank``); a pattern with more than %j and %t is left out."""
        out: dict[str, str] = {}
        flags = self.launcher.srun[1:-5]
        for key, flag in (("stdout", "--output"), ("stderr", "--error")):
            values = [flags[i + 1] for i, f in enumerate(flags[:-1]) if f == flag]
            values += [f.split("=", 1)[1] for f in flags if f.startswith(flag + "=")]
            if values:
                path = values[-1].replace("%j", str(self.state.job)).replace("%t", str(rank))
                if "%" not in path and os.path.isabs(path):
                    out[key] = path
        return out

    def close(self) -> None:
        for proc in self.spares.values():
            with contextlib.suppress(OSError):
                if proc.stdin:
                    proc.stdin.close()  # an unused spare exits 0 at the end of its input
        for proc in self.spares.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.terminate()
        for k in self.kills:
            with contextlib.suppress(subprocess.TimeoutExpired):
                k.proc.wait(timeout=10)
        for r in self.current.values():
            if r.proc.poll() is None:
                r.proc.terminate()
        if self.store is not None:
            self.store.stop()

    # --- while the attempt runs -------------------------------------------
    def running(self) -> bool:
        """A replacement step still runs."""
        return any(r.proc.poll() is None for r in self.current.values())

    def watch(self, replace: bool = True) -> None:
        """Each poll: the main step's task deaths, then the replacements'
        (``replace``: start replacements; False once the main step ended)."""
        if self.gave_up:
            return
        stopping = self.state.stopping is not None or not replace  # a stop: no replacements; they get it too
        if self.state.stopping is not None and self.a.forwarded and not self.forwarded:
            self.forwarded = True
            for r in self.current.values():
                with contextlib.suppress(OSError):
                    r.proc.send_signal(signal.SIGUSR2)
        if not stopping:
            self._check_kills()  # first: a hang's word reaches the store before its replacement starts
        new, self.seen = self.a.srun_errors[self.seen :], len(self.a.srun_errors)
        for _, line in new:
            dead = dead_tasks(line)
            for rank in dead[1] if dead else []:
                if rank in self.current:
                    continue  # the main step's word on a rank already replaced
                assert dead is not None
                self.ended[rank] = dead[2]  # None: a signal
                if not stopping and dead[2] not in STOP_CODES:
                    self._note_dead(rank)
                    self._replace(rank, dead[0], f"task {rank} on {dead[0]}: {line.split(': ')[-1]}")
        if not stopping and self.store is not None:
            while not self.store.channel.missing.empty():
                gen, missing = self.store.channel.missing.get()
                for rank, incarnation in missing:
                    self._kill_hung(rank, gen, incarnation)
            self._refill()
        for rank, r in list(self.current.items()):
            code = r.proc.poll()
            if code is None or code in (0, *STOP_CODES) or r.handled or stopping:
                continue
            r.handled = True
            self._note_dead(rank)
            self._replace(rank, r.node, f"replacement of rank {rank} on {r.node}: exit {code}")

    def _note_dead(self, rank: int) -> None:
        """The survivors abort now (the store host flags the live generation;
        said before the replacement starts)."""
        if self.store is not None:
            self.store.channel.note_dead(rank, self.incarnations.get(rank, 0))

    def _kill_hung(self, rank: int, gen: int, incarnation: int | None) -> None:
        """A rank the store host found missing after a fault: alive, never
        leaving the broken generation. Its process (node and pid from its
        heartbeat in this attempt) is SIGKILLed by a one-task step on its
        node; srun's word of that death then starts its replacement. Left
        be: a process newer than the ``incarnation`` named (none named: no
        process of the rank was in the broken generation), a rank already
        dead, a replacement that never trained yet (still starting: the
        start-up hang limit covers it) and one started within a collective
        timeout (this fault's own)."""
        if incarnation != self.incarnations.get(rank, 0):
            return  # the named process is not the rank's newest: its replacement is started
        if rank in self.ended and rank not in self.current:
            return  # dead, and its replacement is not started: nothing to kill
        hb = read_heartbeats(self.state.run_dir).get(rank) or {}
        pid, node = hb.get("pid"), hb.get("node")
        r = self.current.get(rank)
        recent = time.time() - self.state.cfg.launcher.in_process_collective_timeout_s
        if r is not None and (r.proc.poll() is not None or hb.get("phase") not in STEP_PHASES
                              or float(hb.get("time", 0)) < r.started
                              or r.started > recent):  # fmt: skip
            return  # this fault's own replacement (named as its generation formed), or one still starting
        if hb.get("attempt") != self.a.tag or not isinstance(pid, int) or pid <= 1 or not is_node_name(node):
            say(f"attempt {self.a.tag}: rank {rank} is missing after a fault, but its heartbeat names no "
                f"process of this attempt ({hb or 'none'}): not killed")  # fmt: skip
            return
        say(
            f"attempt {self.a.tag}: rank {rank} neither left the broken generation nor joined the next "
            f"after the fault: killing pid {pid} on {node} (in-process recovery)"
        )
        self.kills.append(Kill(rank, gen, pid, node, self._kill_step(pid, node)))

    def _kill_step(self, pid: int, node: str) -> subprocess.Popen[bytes]:
        # Its exit tells a live process killed (KILLED) from one gone already
        # (GONE: a death whose srun word is still coming); the pid, an int from
        # a checked heartbeat, is an argument of the script, never part of it.
        script = 'kill -KILL "$1" 2>/dev/null && exit 0; [ -d "/proc/$1" ] && exit 1; exit 3'
        cmd = [self.launcher.srun[0], "--overlap", f"--nodelist={node}", "--nodes=1", "--ntasks=1",
               "--ntasks-per-node=1", "--kill-on-bad-exit=0", "sh", "-c", script, "meshrun-kill", str(pid)]  # fmt: skip
        return subprocess.Popen(
            cmd, env=self.launcher.env(self.a.nodes, self.n, self.a.tag), stdin=subprocess.DEVNULL
        )

    def _check_kills(self) -> None:
        """Each kill step's end: a live process killed is a hang (the store
        keeps it: the trainer's record says rank_hung); one gone already, a
        death. A step that failed (not created, the process still there)
        while the rank's death was not seen since: said, tried again, and
        after KILL_TRIES the attempt ends (the restart path follows now,
        not at the hang limit)."""
        for k in list(self.kills):
            code = k.proc.poll()
            if code is None:
                continue
            if code in (KILLED, GONE):
                self.kills.remove(k)
                if code == KILLED:
                    assert self.store is not None
                    self.store.channel.note_hung(k.gen, k.rank)
                    say(f"attempt {self.a.tag}: rank {k.rank} was hung: pid {k.pid} on {k.node} killed")
                else:
                    say(f"attempt {self.a.tag}: rank {k.rank}'s pid {k.pid} on {k.node} had died already")
                continue
            r = self.current.get(k.rank)
            if r is not None and r.started >= k.issued:
                self.kills.remove(k)  # it died meanwhile (kill found no process): replaced already
                continue
            say(f"attempt {self.a.tag}: the step killing hung rank {k.rank} (pid {k.pid} on {k.node}) "
                f"exited {code} (try {k.tries} of {KILL_TRIES})")  # fmt: skip
            if k.tries >= KILL_TRIES:
                self.kills.remove(k)
                self.give_up(f"hung rank {k.rank} (pid {k.pid} on {k.node}) could not be killed")
                return
            k.proc, k.tries = self._kill_step(k.pid, k.node), k.tries + 1

    def _replace(self, rank: int, node: str, why: str) -> None:
        if self.gave_up:
            return
        if self.left <= 0:
            self.give_up(f"{why}; no replacement left (launcher.max_replacements)")
            return
        self.left -= 1
        self.incarnations[rank] = inc = self.incarnations.get(rank, 0) + 1
        target = self._node_for(rank, node)
        spare = self.spares.pop(target, None)
        if spare is not None and spare.poll() is None and spare.stdin is not None:
            say(
                f"attempt {self.a.tag}: {why}: the warm spare on {target} takes rank {rank} "
                f"(in-process recovery, {self.left} replacement(s) left)"
            )
            plan = self.state.plan
            with contextlib.suppress(OSError):  # a spare that died meanwhile: its exit is the replacement's
                spare.stdin.write(
                    assignment(rank, plan.world_size, self.launcher.rpn, inc, self._outputs(rank))
                )
                spare.stdin.flush()
            self.current[rank] = Replacement(rank, target, spare)
            if node != target:
                self.refill = (node, rank)
            return
        say(
            f"attempt {self.a.tag}: {why}: starting a replacement for rank {rank} on {target} "
            f"(in-process recovery, {self.left} replacement(s) left)"
        )
        self.current[rank] = Replacement(rank, target, self._start(rank, target, inc))

    def _node_for(self, rank: int, dead_node: str) -> str:
        """A held spare no task of the attempt uses, else the dead task's
        node. Rank 0 stays on its node: it hosts the checkpoint worker's
        store at MASTER_ADDR, which the survivors keep (train/checkpoint/wiring.py)."""
        if rank == 0:
            return dead_node
        busy = set(self.a.nodes) | {r.node for r in self.current.values() if r.proc.poll() is None}
        spares = [x for x in healthy_nodes(self.state) if x not in busy]
        return spares[0] if spares else dead_node

    def _start(self, rank: int, node: str, incarnation: int) -> subprocess.Popen[str]:
        srun, rpn, world = self.launcher.srun, self.launcher.rpn, self.state.plan.world_size
        flags = [f.replace("%t", str(rank)) for f in kill_on_bad_exit_off(srun[1:-5])]
        cmd = [srun[0], "--overlap", f"--nodelist={node}", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1"]
        cmd += [*flags, *srun[-5:]]
        env = self.launcher.env(self.a.nodes, self.n, self.a.tag)
        assert self.store is not None
        env.update(
            {
                RECOVERY_STORE_ENV: self.store.address,
                REPLACEMENT_ENV: str(incarnation),
                "RANK": str(rank),
                "WORLD_SIZE": str(world),
                "LOCAL_RANK": str(rank % rpn),
                "LOCAL_WORLD_SIZE": str(rpn),
                "GROUP_RANK": str(rank // rpn),
            }
        )
        return subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, text=True)

    def give_up(self, why: str) -> None:
        """In-process recovery cannot go on: end every step of the attempt."""
        self.gave_up = why
        say(f"attempt {self.a.tag}: {why}: ending the attempt (the restart path follows)")
        steps = sorted(
            {str(h["step_id"]) for h in read_heartbeats(self.state.run_dir).values()
             if h.get("attempt") == self.a.tag and h.get("step_id")}
        )  # fmt: skip
        if steps:
            slurm_cmd(["scancel", "--signal=KILL", *(f"{self.state.job}.{s}" for s in steps)])
        for r in [*self.current.values(), *(Replacement(-1, n, p) for n, p in self.spares.items())]:
            if r.proc.poll() is None:
                r.proc.terminate()

    # --- after it ----------------------------------------------------------
    def exit_code(self, rc: int) -> int:
        """The attempt's exit as one srun's would be had no task died: each
        rank's last process's code (a replaced rank: its newest
        replacement's; the main step's others: srun's word, else 0)."""
        if self.gave_up or not self.current:
            return rc if not self.gave_up else (rc or 1)
        for rank, r in self.current.items():
            self.ended[rank] = r.proc.wait()
        codes = [c if c is not None else 1 for c in self.ended.values()]
        final = max(codes, default=0)
        # The replaced ranks' deaths were recovered: no failure of the attempt
        # (a stop code beside them stays a stop; attribution never sees them).
        self.a.srun_errors = [
            (t, x)
            for t, x in self.a.srun_errors
            if not set((dead_tasks(x) or ("", [], 0))[1]) & set(self.current)
        ]
        if final == 0 and rc != 0:
            say(
                f"attempt {self.a.tag}: srun exit {rc} is its replaced tasks'; every rank's last process exited 0"
            )
        return final
