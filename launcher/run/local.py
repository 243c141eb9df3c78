"""Run a planned job on this machine: N processes of the same entry point a
Slurm task runs (``python -m train <run_dir>``; job=script: the task
wrapper, ``python -m launcher.taskwrap <run_dir>``), with torchrun-style rank
variables. Rank 0's output streams to the terminal; every rank logs to
``<run_dir>/logs/rank<N>.log``. Ctrl-C asks the ranks to checkpoint and stop
(the same USR2 a preempted Slurm job gets) before anything is killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import TextIO

from launcher.config.runfiles import FAILURES_FILE, REQUEUE_EXIT_CODE, RESULT_FILE
from launcher.config.runrecord import read_record
from launcher.config.schema import ClusterConfig
from launcher.config.scriptjob import PROJECT_DIR_ENV, tasks_per_node
from launcher.config.secrets import AWS_SECRET_NAMES
from launcher.config.spec import LAUNCHER_PID_ENV, RunSpec
from launcher.config.validate import s3_credentials_file, s3_credentials_source
from launcher.config.warmspare import REPLACEMENT_ENV, assignment
from launcher.run.codewalk import SNAPSHOT_FILE
from launcher.run.localrecovery import (
    RECOVERY_STORE_ENV,
    StoreChannel,
    StoreHost,
    recoveries_done,
    recovery_store,
    spare_env,
)

TIMED_OUT = 124  # as timeout(1)
# train/inprocess/rendezvous.py's variables (the launcher never imports train).
GRACE_S = 30.0  # time ranks get to checkpoint after Ctrl-C
# Time the other ranks get to exit after one failed, then SIGKILL. Ranks
# answer SIGTERM by trying to checkpoint (exit 75), which cannot finish
# without the failed peer (a save is collective): this only lets them flush
# their logs, and must stay a few seconds.
PEER_STOP_S = 3.0


def detect_local_gpus() -> tuple[int, str, float]:
    """(count, name, memory GB) of this machine's GPUs via nvidia-smi; no torch."""
    if shutil.which("nvidia-smi") is None:
        return 0, "", 0.0
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return 0, "", 0.0
    rows = [r.split(",") for r in out.strip().splitlines() if r.strip()]
    if not rows:
        return 0, "", 0.0
    return len(rows), rows[0][0].strip(), float(rows[0][1]) / 1024.0


def plain_gpu_name(name: str) -> str:
    """nvidia-smi's name as a cluster.gpu_type (a plain name: validate.py):
    "NVIDIA H200" -> "H200", "NVIDIA H100 80GB HBM3" -> "H100-80GB-HBM3"."""
    name = re.sub(r"^NVIDIA\s+", "", name.strip())
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", name).strip("-") or "GPU"


def use_local_gpus(cluster: ClusterConfig) -> None:
    """cluster=local uses this machine's GPUs (NCCL) when there are any."""
    if cluster.kind != "local" or cluster.gpus_per_node:
        return
    count, name, mem_gb = detect_local_gpus()
    if count:
        cluster.gpus_per_node = count
        cluster.gpu_type = plain_gpu_name(name)
        cluster.gpu_mem_gb = mem_gb
        if "H200" in name or "H100" in name:
            cluster.gpu_peak_bf16_tflops = 989.0
        elif "A100" in name:
            cluster.gpu_peak_bf16_tflops = 312.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(spec: RunSpec, rank: int, port: int) -> dict[str, str]:
    plan = spec.plan
    env = dict(os.environ)
    if s3_credentials_source(spec.cfg) in ("file", "role"):
        # The source the run names, not keys that happen to be exported (boto3 prefers those).
        env = {k: v for k, v in env.items() if k.upper() not in AWS_SECRET_NAMES}
    if s3_credentials_file(spec.cfg):
        env["AWS_SHARED_CREDENTIALS_FILE"] = s3_credentials_file(spec.cfg)
    env.update(spec.cfg.cluster.env)
    threads = max(1, (os.cpu_count() or 1) // plan.world_size)
    env.update(
        {
            "RANK": str(rank),
            "WORLD_SIZE": str(plan.world_size),
            "LOCAL_RANK": str(rank % plan.ranks_per_node),
            "LOCAL_WORLD_SIZE": str(plan.ranks_per_node),
            "GROUP_RANK": str(rank // plan.ranks_per_node),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", str(threads)),
            "PYTHONUNBUFFERED": "1",
            # train/observe/lifeline.py: the rank dies with this launcher.
            LAUNCHER_PID_ENV: str(os.getpid()),
        }
    )
    project = recorded_project(spec.run_dir)
    if project:  # job=script: the program starts in the run's own copy (launcher/taskwrap/workcopy.py)
        env[PROJECT_DIR_ENV] = project
    return env


def recorded_project(run_dir: str) -> str | None:
    """The store entry of a script job's project, as its run record names it
    (launcher/run/codesnap.py stores it for local runs too); None without one."""
    rec = read_record(run_dir) or {}
    project = str(((rec.get("code") or {}).get("project") or {}).get("dir") or "")
    return project if project and (Path(project).parent / SNAPSHOT_FILE).is_file() else None


def entry(spec: RunSpec) -> list[str]:
    """What each local rank runs: the trainer, or job=script's task wrapper."""
    module = "launcher.taskwrap" if spec.cfg.job.kind == "script" else "train"
    return [sys.executable, "-m", module, spec.run_dir]


def local_tasks(spec: RunSpec) -> int:
    """Processes to start: one per rank (job.launch=torchrun: one, it forks the ranks)."""
    j = spec.cfg.job
    return spec.plan.nodes * tasks_per_node(j.kind, j.launch, spec.plan.ranks_per_node)


class _Sink:
    """Where a process's output goes: its log file, and the terminal for
    rank 0 (a warm spare's is re-pointed to the rank it takes)."""

    def __init__(self, log: TextIO, echo: TextIO | None) -> None:
        self.log, self.echo = log, echo


def _pump(src: TextIO, sink: _Sink) -> None:
    for line in src:
        log, echo = sink.log, sink.echo
        log.write(line)
        log.flush()
        if echo is not None:
            echo.write(line)
            echo.flush()


def run_local(spec: RunSpec, echo: TextIO | None = sys.stdout, timeout_s: float | None = None) -> int:
    """Start every rank, wait, and return the exit code: 0, the failing
    rank's code (a signal death as 128 + signal), 130 after Ctrl-C, or 124
    when ``timeout_s`` passes first (a hung collective must not hang a test
    suite or a benchmark). When one rank fails the others are stopped within
    seconds (fail fast; they cannot finish or checkpoint without it) and the
    failing rank is named with its last log lines."""
    logs = Path(spec.run_dir) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    port = spec.cfg.launcher.master_port or free_port()
    started = time.time()
    store = recovery_store(spec)  # launcher.in_process_recovery: the generations' store host
    starter = _Starter(spec, port, echo, store)
    ranks = _Ranks(
        starter.start if store is not None else None,
        spec.cfg.launcher.max_replacements,
        store.channel if store is not None else None,
    )
    for rank in range(local_tasks(spec)):
        ranks.add(starter.start(rank))
    starter.start_spare()
    ranks.tick = starter.tick
    failed: int | None = None
    try:
        with _interrupt_on_termination():
            try:
                deadline = None if timeout_s is None else time.monotonic() + timeout_s
                code, failed = ranks.wait(deadline=deadline)
                if code == TIMED_OUT:
                    print(f"meshrun: ranks still running after {timeout_s:.0f} s; killed", file=sys.stderr)
            except KeyboardInterrupt:
                print(
                    "\nmeshrun: interrupted; asking ranks to checkpoint and stop (Ctrl-C again to kill)",
                    file=sys.stderr,
                )
                ranks.signal(signal.SIGUSR2)
                with contextlib.suppress(KeyboardInterrupt):
                    ranks.wait(deadline=time.monotonic() + GRACE_S)
                code = 130
    finally:
        ranks.kill()  # whatever happened above, no rank outlives this call
        starter.stop_spare()
        if store is not None:
            store.stop()
    starter.close()
    if failed is not None:
        # A rank that raised records itself in failures.log before exiting;
        # that beats the order exits were reaped in (a peer that died of
        # "connection reset" can be reaped first). A rank killed by a signal
        # writes nothing, and nobody signals a rank before this point, so a
        # signal death reaped first is the failure itself.
        first = first_failure(Path(spec.run_dir), started)
        error = ""
        if first is not None and 0 <= first[0] < len(ranks.procs) and ranks.codes[failed] >= 0:
            failed, error = first
        rc = ranks.procs[failed].returncode
        how = _describe(rc) if rc is not None else "failed"
        code = _exit_status(rc) if rc not in (None, 0, REQUEUE_EXIT_CODE) else code
        tail = (logs / f"rank{failed}.log").read_text(errors="replace").splitlines()[-15:]
        print(
            f"meshrun: rank {failed} failed ({how}); stopped the other ranks. "
            + (f"Its error: {error}. " if error else "")
            + f"Last lines of {logs / f'rank{failed}.log'}:",
            file=sys.stderr,
        )
        print("\n".join("  " + line for line in tail), file=sys.stderr)
        _record_failed(Path(spec.run_dir), failed, how, started)
    return code


class _Starter:
    """Starts a rank (or a replacement for one, launcher.in_process_recovery)
    with its environment, its log file and the pump that fills it."""

    def __init__(self, spec: RunSpec, port: int, echo: TextIO | None, store: StoreHost | None) -> None:
        self.spec, self.port, self.echo, self.store = spec, port, echo, store
        self.logs = Path(spec.run_dir) / "logs"
        self.pumps: list[threading.Thread] = []
        self.log_files: list[TextIO] = []
        self.spare: tuple[subprocess.Popen[str], _Sink] | None = None  # the warm spare and its output's sink
        self.spare_after: int | None = None  # the next one starts once this many recoveries are done

    def start(self, rank: int, incarnation: int = 0) -> subprocess.Popen[str]:
        """Rank ``rank``'s process ``incarnation`` (0: its first; n: its n-th
        replacement, the warm spare when one waits, then a new spare)."""
        if incarnation and self.spare is not None and self.spare[0].poll() is None:
            p, sink = self.spare
            assert p.stdin is not None
            p.stdin.write(
                assignment(rank, self.spec.plan.world_size, self.spec.plan.ranks_per_node, incarnation)
            )
            p.stdin.flush()
            sink.log, sink.echo = self._log(f"rank{rank}.log"), self.echo if rank == 0 else None
            # The next spare once this recovery's first step is done (as on
            # Slurm): its start-up (torch's import) would compete with the
            # recovery for the CPUs now.
            self.spare, self.spare_after = None, recoveries_done(self.spec.run_dir) + 1
            return p
        env = rank_env(self.spec, rank, self.port)
        if self.store is not None:
            env[RECOVERY_STORE_ENV] = self.store.address
            if incarnation:
                env[REPLACEMENT_ENV] = str(incarnation)
        return self._spawn(env, _Sink(self._log(f"rank{rank}.log"), self.echo if rank == 0 else None))

    def tick(self) -> None:
        """Each poll of the ranks: the next warm spare, when due."""
        if self.spare_after is not None and recoveries_done(self.spec.run_dir) >= self.spare_after:
            self.spare_after = None
            self.start_spare()

    def start_spare(self) -> None:
        """A warm spare (launcher.warm_spare): a rank's process with no rank yet (launcher/config/warmspare.py)."""
        if self.store is None or not self.spec.cfg.launcher.warm_spare:
            return
        env = spare_env(rank_env(self.spec, 0, self.port), self.store.address)
        sink = _Sink(self._log("spare.log"), None)
        self.spare = (self._spawn(env, sink, stdin=subprocess.PIPE), sink)

    def _log(self, name: str) -> TextIO:
        log = open(self.logs / name, "a")  # noqa: SIM115 - closed after the pumps end
        self.log_files.append(log)
        return log

    def _spawn(self, env: dict[str, str], sink: _Sink, stdin: int | None = None) -> subprocess.Popen[str]:
        p = subprocess.Popen(
            entry(self.spec),
            env=env,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # Ctrl-C reaches us only; we forward USR2
        )
        t = threading.Thread(target=_pump, args=(p.stdout, sink), daemon=True)
        t.start()
        self.pumps.append(t)
        return p

    def stop_spare(self) -> None:
        """The unused spare: its input closed (it exits 0), killed if it lingers."""
        if self.spare is None:
            return
        p, self.spare = self.spare[0], None
        with contextlib.suppress(OSError):
            if p.stdin:
                p.stdin.close()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()

    def close(self) -> None:
        for t in self.pumps:
            t.join(timeout=5)
        for f in self.log_files:
            f.close()


def first_failure(run_dir: Path, since: float) -> tuple[int, str] | None:
    """(rank, error) of the earliest ``failures.log`` line a local rank
    wrote at or after ``since`` (the file is appended to across starts;
    lines are ``<job> <restart> rank <r> <unix time>: <error>``), or None."""
    try:
        text = (run_dir / FAILURES_FILE).read_text(errors="replace")
    except OSError:
        return None
    best: tuple[float, int, str] | None = None
    for line in text.splitlines():
        head, sep, error = line.partition(": ")
        parts = head.split()
        if not sep or len(parts) != 5 or parts[0] != "local" or parts[2] != "rank":
            continue
        try:
            rank, when = int(parts[3]), float(parts[4])
        except ValueError:
            continue
        if when >= since and (best is None or when < best[0]):
            best = (when, rank, error)
    return None if best is None else (best[1], best[2])


def _record_failed(run_dir: Path, rank: int, how: str, started: float) -> None:
    """result.json says ``failed`` and names the rank that failed first.
    Rank 0 writes it when it raised itself; after a failure elsewhere it was
    killed (or wrote its own peer-connection error), which would leave no
    result, an earlier start's ``completed``, or blame on the wrong rank."""
    path = run_dir / RESULT_FILE
    if rank == 0:
        with contextlib.suppress(OSError, ValueError):
            if path.stat().st_mtime >= started and json.loads(path.read_text()).get("status") == "failed":
                return  # rank 0's own report of this start
    doc = {
        "final_step": -1,
        "final_loss": None,
        "status": "failed",
        "error": f"rank {rank}: {how}",
        "rank": rank,
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def _describe(code: int) -> str:
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit {code}"


def _exit_status(code: int) -> int:
    """A rank's returncode as a process exit status (signals as 128 + n, like a shell)."""
    return 128 - code if code < 0 else code


class _Ranks:
    """The rank processes, with one reaper thread each: exits arrive in the
    order they happened, so the rank that failed first (not a peer that
    failed because of it) is the one named. With ``respawn``
    (launcher.in_process_recovery) a rank that dies while the others train
    is replaced in place, up to ``max_respawns`` times."""

    def __init__(
        self,
        respawn: Callable[..., subprocess.Popen[str]] | None = None,
        max_respawns: int = 0,
        store: StoreChannel | None = None,
    ) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        self.codes: dict[int, int] = {}
        self._exits: queue.Queue[tuple[int, subprocess.Popen[str], int]] = queue.Queue()
        self.respawn, self.respawns_left = respawn, max_respawns
        self.incarnations: dict[int, int] = {}  # rank -> its newest process's (0: the first)
        self.store = store  # the store host's word of hung ranks (in-process recovery)
        self.tick: Callable[[], None] = lambda: None  # called each poll (the next warm spare)

    def add(self, p: subprocess.Popen[str], rank: int | None = None) -> None:
        if rank is None:
            rank = len(self.procs)
            self.procs.append(p)
        else:
            self.procs[rank] = p
        threading.Thread(target=lambda: self._exits.put((rank, p, p.wait())), daemon=True).start()

    def wait(self, deadline: float | None = None) -> tuple[int, int | None]:
        """(exit status, failed rank or None). Returns at the first failure
        (after stopping the rest), when all ranks are done, or at the
        deadline (TIMED_OUT). A rank asking for a requeue (Ctrl-C's USR2) is
        not a failure: its peers are stopping at the same step."""
        while len(self.codes) < len(self.procs):
            self._kill_hung()
            self.tick()
            timeout = 0.5 if deadline is None else max(0.0, min(0.5, deadline - time.monotonic()))
            try:
                rank, p, code = self._exits.get(timeout=timeout)
            except queue.Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    return TIMED_OUT, None
                continue
            if p is not self.procs[rank]:
                continue  # a replaced process's exit, reaped late
            if code not in (0, REQUEUE_EXIT_CODE) and self._replace(rank, code):
                continue
            self.codes[rank] = code
            if code not in (0, REQUEUE_EXIT_CODE):
                self.stop()
                return _exit_status(code), rank
        return max(self.codes.values(), default=0), None

    def _replace(self, rank: int, code: int) -> bool:
        """Start a replacement for ``rank`` while every other rank still
        trains (they wait for it at their rendezvous); False: none."""
        if self.respawn is None or self.respawns_left <= 0 or self.codes:
            return False
        self.respawns_left -= 1
        dead = self.incarnations.get(rank, 0)
        if self.store is not None:  # before the replacement starts (train/inprocess/missing.py flag_dead)
            self.store.note_dead(rank, dead)
        print(
            f"meshrun: rank {rank} died ({_describe(code)}); starting a replacement "
            f"(in-process recovery, {self.respawns_left} left)",
            file=sys.stderr,
            flush=True,
        )
        self.incarnations[rank] = dead + 1
        self.add(self.respawn(rank, dead + 1), rank)
        return True

    def _kill_hung(self) -> None:
        """Ranks the store host found missing after a fault (alive, never
        leaving the broken generation): killed, so they are replaced as a
        dead rank is, a replacement that hung after it joined too. Left be:
        a process newer than the one named (the replacement started for
        this fault, still starting), a rank none of whose processes was in
        the broken generation, a dead one."""
        while self.store is not None and not self.store.missing.empty():
            gen, missing = self.store.missing.get()
            for rank, incarnation in missing:
                p = self.procs[rank] if 0 <= rank < len(self.procs) else None
                newest = self.incarnations.get(rank, 0)
                if p is None or incarnation != newest or p.poll() is not None or self.codes:
                    continue
                self.store.note_hung(gen, rank)
                print(
                    f"meshrun: rank {rank} neither left the broken generation nor joined the next "
                    "after the fault: hung; killing it (in-process recovery)",
                    file=sys.stderr,
                    flush=True,
                )
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)

    def signal(self, sig: int) -> None:
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(sig)

    def stop(self) -> None:
        """SIGTERM, PEER_STOP_S to exit, then SIGKILL."""
        self.signal(signal.SIGTERM)
        end = time.monotonic() + PEER_STOP_S
        while any(p.poll() is None for p in self.procs) and time.monotonic() < end:
            time.sleep(0.1)
        self.kill()

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                # The rank's whole session: its data-loader workers too.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()


@contextlib.contextmanager
def _interrupt_on_termination() -> Iterator[None]:
    """SIGTERM / SIGHUP to the launcher (``kill``, a closed terminal) act
    like Ctrl-C: ranks checkpoint and stop instead of being orphaned."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    old = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
