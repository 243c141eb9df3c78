"""Run a planned job on this machine: N processes of the same entry point a
Slurm task runs (``python -m train <run_dir>``), with torchrun-style rank
variables. Rank 0's output streams to the terminal; every rank logs to
``<run_dir>/logs/rank<N>.log``. Ctrl-C asks the ranks to checkpoint and stop
(the same USR2 a preempted Slurm job gets) before anything is killed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

from launcher.schema import ClusterConfig
from launcher.spec import RunSpec

TIMED_OUT = 124  # as timeout(1)
GRACE_S = 30.0  # time ranks get to checkpoint after Ctrl-C or a failed peer


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


def use_local_gpus(cluster: ClusterConfig) -> None:
    """cluster=local uses this machine's GPUs (NCCL) when there are any."""
    if cluster.kind != "local" or cluster.gpus_per_node:
        return
    count, name, mem_gb = detect_local_gpus()
    if count:
        cluster.gpus_per_node = count
        cluster.gpu_type = name
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
        }
    )
    return env


def _pump(src: TextIO, log: TextIO, echo: TextIO | None) -> None:
    for line in src:
        log.write(line)
        log.flush()
        if echo is not None:
            echo.write(line)
            echo.flush()


def run_local(spec: RunSpec, echo: TextIO | None = sys.stdout, timeout_s: float | None = None) -> int:
    """Start every rank, wait, and return the first non-zero exit code (or 0).
    With ``timeout_s``, ranks still running then are killed (exit 124): a
    hung collective must not hang a test suite or a benchmark."""
    logs = Path(spec.run_dir) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    port = spec.cfg.launcher.master_port or free_port()
    procs: list[subprocess.Popen[str]] = []
    pumps: list[threading.Thread] = []
    log_files: list[TextIO] = []
    for rank in range(spec.plan.world_size):
        p = subprocess.Popen(
            [sys.executable, "-m", "train", spec.run_dir],
            env=rank_env(spec, rank, port),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # Ctrl-C reaches us only; we forward USR2
        )
        log = open(logs / f"rank{rank}.log", "a")  # noqa: SIM115 - closed after the pumps end
        log_files.append(log)
        t = threading.Thread(target=_pump, args=(p.stdout, log, echo if rank == 0 else None), daemon=True)
        t.start()
        procs.append(p)
        pumps.append(t)
    try:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        code = _wait(procs, deadline=deadline)
        if code == TIMED_OUT:
            print(f"meshrun: ranks still running after {timeout_s:.0f} s; killed", file=sys.stderr)
            _kill_all(procs)
    except KeyboardInterrupt:
        print(
            "\nmeshrun: interrupted; asking ranks to checkpoint and stop (Ctrl-C again to kill)",
            file=sys.stderr,
        )
        _signal_all(procs, signal.SIGUSR2)
        with contextlib.suppress(KeyboardInterrupt):
            _wait(procs, deadline=time.monotonic() + GRACE_S)
        _kill_all(procs)
        code = 130
    for t in pumps:
        t.join(timeout=5)
    for f in log_files:
        f.close()
    if code:
        failed = next((i for i, p in enumerate(procs) if p.returncode not in (0, None, -signal.SIGTERM)), 0)
        tail = (logs / f"rank{failed}.log").read_text().splitlines()[-15:]
        print(
            f"meshrun: rank {failed} failed (exit {procs[failed].returncode}); last lines of its log:",
            file=sys.stderr,
        )
        print("\n".join("  " + line for line in tail), file=sys.stderr)
    return code


def _wait(procs: list[subprocess.Popen[str]], deadline: float | None = None) -> int:
    """Wait for all ranks; if one fails, give the rest GRACE_S then kill them."""
    while True:
        codes = [p.poll() for p in procs]
        bad = [c for c in codes if c not in (None, 0)]
        if bad:
            _signal_all(procs, signal.SIGTERM)
            end = time.monotonic() + GRACE_S
            while any(p.poll() is None for p in procs) and time.monotonic() < end:
                time.sleep(0.2)
            _kill_all(procs)
            return bad[0]
        if all(c == 0 for c in codes):
            return 0
        if deadline is not None and time.monotonic() > deadline:
            return TIMED_OUT
        time.sleep(0.1)


def _signal_all(procs: list[subprocess.Popen[str]], sig: int) -> None:
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(sig)


def _kill_all(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
