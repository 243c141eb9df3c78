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

# Best of several n x n matmuls on one thread (fp32, and bf16 where the
# CPU has bf16 units: 4-5x fp32 on this project's EPYC host); thread CPU time.
_PROBE = r"""
import json, sys, time
n = 384
def rate(mm):
    mm()
    best = 0.0
    for _ in range(15):
        t0 = time.thread_time()
        for _ in range(4):
            mm()
        dt = time.thread_time() - t0
        if dt > 0:
            best = max(best, 4 * 2 * n**3 / dt / 1e9)
    return best
try:
    import torch
    torch.set_num_threads(1)
    a, b = torch.randn(n, n), torch.randn(n, n)
    fp32 = rate(lambda: torch.mm(a, b))
    a16, b16 = a.bfloat16(), b.bfloat16()
    bf16 = rate(lambda: torch.mm(a16, b16))
    how = "torch " + torch.__version__
except ImportError:
    import numpy as np
    a, b = np.random.rand(n, n).astype(np.float32), np.random.rand(n, n).astype(np.float32)
    fp32 = bf16 = rate(lambda: a @ b)  # numpy has no bf16: the fp32 rate stands in
    how = "numpy " + np.__version__
print(json.dumps({"gflops_per_core": fp32, "bf16_gflops_per_core": bf16, "how": how}))
"""


@dataclass(frozen=True)
class CpuPeak:
    gflops_per_core: float  # fp32
    bf16_gflops_per_core: float
    cores: int
    host: str
    how: str  # probe backend and when, or where the figure came from

    def per_core(self, precision: str) -> float:
        return self.bf16_gflops_per_core if precision == "bf16" else self.gflops_per_core


def host_key() -> str:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{socket.gethostname()} ({model or platform.processor() or platform.machine()})"


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


def cpu_peak() -> CpuPeak:
    """This host's peak, from the cache or (first time) the probe."""
    key = host_key()
    cached = _read_cache().get(key)
    if cached and "bf16_gflops_per_core" in cached:
        return CpuPeak(
            cached["gflops_per_core"], cached["bf16_gflops_per_core"], host_cores(), key, cached["how"]
        )
    peak = measure()
    data = _read_cache()
    data[key] = {
        "gflops_per_core": peak.gflops_per_core,
        "bf16_gflops_per_core": peak.bf16_gflops_per_core,
        "how": peak.how,
    }
    try:
        CACHE.parent.mkdir(parents=True, exist_ok=True)
        tmp = CACHE.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(CACHE)
    except OSError:
        pass  # read-only home: measure again next time
    return peak
