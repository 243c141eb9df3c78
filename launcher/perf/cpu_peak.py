"""Peak matmul rate of this host's CPU cores, measured (not guessed) so
that a CPU rank's MFU is a share of what its cores can actually do.

A short fp32 matmul probe runs in a child process (torch when it is
installed, as the trainer uses it, else numpy; the launcher itself never
imports torch) on one thread, timed by the thread's CPU time so that other
work on a shared host does not lower it. The best of a few repeats is kept
in ``~/.cache/meshrun/cpu_peak.json`` per host (hostname + CPU model), so
the probe runs once per host.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

CACHE = Path(os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache"))) / "meshrun" / "cpu_peak.json"

# Best of several n x n matmuls on one thread (fp32, and bf16 where torch
# has it); thread CPU time. Each in the three layouts a Linear layer's
# training runs (forward x @ w.T, input gradient g @ w, weight gradient
# g.T @ x), keeping the fastest: CPU kernels differ by layout (bf16 on an
# AVX2-only EPYC: 2.8, 7.2 and 17 GFLOP/s), and a peak below what training
# reaches would put its MFU above 1.
_PROBE = r"""
import json, sys, time
n = 384
def rate(mm):
    mm()
    best = 0.0
    for _ in range(10):
        t0 = time.thread_time()
        for _ in range(4):
            mm()
        dt = time.thread_time() - t0
        if dt > 0:
            best = max(best, 4 * 2 * n**3 / dt / 1e9)
    return best
def layouts(a, b, mm):
    return max(rate(lambda: mm(a, b.t())), rate(lambda: mm(a, b)), rate(lambda: mm(a.t(), b)))
try:
    import torch
    torch.set_num_threads(1)
    a, b = torch.randn(n, n), torch.randn(n, n)
    fp32 = layouts(a, b, torch.mm)
    bf16 = layouts(a.bfloat16(), b.bfloat16(), torch.mm)
    how = "torch " + torch.__version__
except ImportError:
    import numpy as np
    a, b = np.random.rand(n, n).astype(np.float32), np.random.rand(n, n).astype(np.float32)
    fp32 = bf16 = rate(lambda: a @ b)  # numpy has no bf16: the fp32 rate stands in
    how = "numpy " + np.__version__
print(json.dumps({"gflops_per_core": fp32, "bf16_gflops_per_core": bf16, "how": how}))
"""
# Cache entries of an older probe (one layout only) are measured again.
PROBE_VERSION = 2


@dataclass(frozen=True)
class CpuPeak:
    gflops_per_core: float  # fp32
    bf16_gflops_per_core: float
    cores: int
    host: str
    how: str  # probe backend and when, or where the figure came from

    def per_core(self, precision: str) -> float:
        return self.bf16_gflops_per_core if precision == "bf16" else self.gflops_per_core


# CPU features that change the matmul rate several-fold: two hosts with the
# same hostname and model string (VMs say "AMD EPYC") but different units
# must not share a cached peak (bf16: ~500 GFLOP/s per core with
# avx512_bf16, ~2 with AVX2 alone).
_MATMUL_FLAGS = ("amx_bf16", "avx512_bf16", "avx512f", "avx2")


def host_key() -> str:
    model, flags = "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
            if model and flags:
                break
    except OSError:
        pass
    units = [f for f in _MATMUL_FLAGS if f in flags]
    name = model or platform.processor() or platform.machine()
    return f"{socket.gethostname()} ({name}{'; ' + ' '.join(units) if units else ''})"


def host_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _read_cache() -> dict:
    try:
        return json.loads(CACHE.read_text())
    except (OSError, ValueError):
        return {}


def measure() -> CpuPeak:
    """Run the probe now (a few seconds with torch's import)."""
    out = subprocess.run(
        [sys.executable, "-c", _PROBE],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    if out.returncode:
        raise RuntimeError(f"CPU matmul probe failed: {out.stderr.strip()[-500:]}")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return CpuPeak(
        r["gflops_per_core"],
        r["bf16_gflops_per_core"],
        host_cores(),
        host_key(),
        f"{r['how']} matmul probe, {when}",
    )


def _cached(key: str) -> CpuPeak | None:
    c = _read_cache().get(key)
    if c and c.get("probe") == PROBE_VERSION:
        return CpuPeak(c["gflops_per_core"], c["bf16_gflops_per_core"], host_cores(), key, c["how"])
    return None


def cpu_peak() -> CpuPeak:
    """This host's peak, from the cache or (first time) the probe. Ranks
    starting together on an unprobed host take a lock, so one probes and the
    rest read its figure (each its own probe would differ by a little)."""
    key = host_key()
    peak = _cached(key)
    if peak:
        return peak
    try:
        CACHE.parent.mkdir(parents=True, exist_ok=True)
        lock = open(CACHE.with_suffix(".lock"), "a")  # noqa: SIM115 (held until probed)
    except OSError:
        return measure()  # read-only home: measure again next time
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        peak = _cached(key)
        if peak:
            return peak
        peak = measure()
        data = _read_cache()
        data[key] = {
            "gflops_per_core": peak.gflops_per_core,
            "bf16_gflops_per_core": peak.bf16_gflops_per_core,
            "how": peak.how,
            "probe": PROBE_VERSION,
        }
        try:
            tmp = CACHE.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, indent=1))
            tmp.replace(CACHE)
        except OSError:
            pass
    return peak


def node_cores(cluster_kind: str, cpus_per_node: int) -> int:
    """Cores one node's ranks share: this host's for local runs, the
    cluster's ``cpus_per_node`` for Slurm CPU nodes (when given)."""
    return host_cores() if cluster_kind == "local" or cpus_per_node <= 0 else cpus_per_node


def rank_peak_gflops(
    precision: str, cores: int, ranks_per_node: int, given_per_core: float = 0.0, given_where: str = ""
) -> tuple[float, float, str]:
    """(GFLOP/s of one CPU rank, GFLOP/s per core, where the per-core figure
    came from) at ``precision``: ``given_per_core`` when > 0 (a calibration
    file's override), else this host's probe. One rule for the performance
    model and the trainer's logged MFU, so the two state the same peak."""
    if given_per_core > 0:
        per_core, how = given_per_core, given_where or "given"
    else:
        peak = cpu_peak()
        per_core, how = peak.per_core(precision), f"measured on {peak.host} ({peak.how})"
    return per_core * cores / max(ranks_per_node, 1), per_core, how
