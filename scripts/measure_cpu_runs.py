"""Measure the CPU rows of the performance model's validation
(launcher/perf/cpu_runs.yaml) with the real trainer.

    python scripts/measure_cpu_runs.py [--only NAME,...] [--repeats 2] [--append]

Each row runs ``python -m launcher cluster=local <overrides>`` (the exact
command is stored with the row) for a few steps, and its step time is the
median ``step_time_s`` of metrics.jsonl after the warm-up steps. This host
is shared: each repeat records the 1-minute load average before and after;
the row keeps every repeat and uses the lowest median (other work only ever
adds time), and a repeat more than 25% above the lowest is marked an
outlier. Results are written back into the YAML file.
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from launcher.perf.calibrate import read_metrics  # noqa: E402
from launcher.perf.cpu_peak import cpu_peak  # noqa: E402
from launcher.perf.cpu_runs import RUNS_FILE, WARMUP_STEPS, command  # noqa: E402

HEADER = """\
# CPU runs measured on this host with the real trainer, for the performance
# model's CPU constants (launcher/plan/validation.py fits them on the
# `calibration` rows and predicts the `held_out` rows). Written by
# scripts/measure_cpu_runs.py: per row the exact command, every repeat's
# median step time (metrics.jsonl after 2 warm-up steps), its steps and the
# 1-minute load average before/after (the host is shared); the row's
# step_time_s is the lowest repeat (other work only adds time). `host`: the
# matmul probe of this host (launcher/perf/cpu_peak.py).
"""


def _busy_s() -> float:
    """CPU seconds all of this host's cores have been busy (/proc/stat)."""
    user, nice, system, _idle, _iowait, irq, softirq = (
        int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]
    )
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def measure(overrides: list[str], run_dir: Path) -> dict:
    cmd = command(overrides) + [f"launcher.run_dir={run_dir}"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    load0 = os.getloadavg()[0]
    busy0, ours0 = _busy_s(), _children_cpu_s()
    t0 = time.time()
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.time() - t0
    load1 = os.getloadavg()[0]
    # The load average counts the run's own ranks; what other work took is
    # the host's busy CPU time less the run's (its whole process tree).
    others = max(0.0, (_busy_s() - busy0) - (_children_cpu_s() - ours0)) / wall
    if r.returncode:
        raise RuntimeError(
            f"{shlex.join(cmd)} failed ({r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}"
        )
    times = read_metrics(run_dir / "metrics.jsonl", skip=WARMUP_STEPS)
    return {
        "step_time_s": round(statistics.median(times), 4),
        "steps": [round(t, 4) for t in times],
        "load_avg_1m": [round(load0, 2), round(load1, 2)],
        "others_cores": round(others, 2),
        "wall_s": round(wall, 1),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated row names")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--file", default=str(RUNS_FILE))
    ap.add_argument("--append", action="store_true", help="add repeats to the row's earlier ones (outliers)")
    a = ap.parse_args()
    path = Path(a.file)
    data = yaml.safe_load(path.read_text())
    only = set(filter(None, a.only.split(",")))
    peak = cpu_peak()
    data["host"] = {
        "gflops_per_core": round(peak.gflops_per_core, 2),
        "bf16_gflops_per_core": round(peak.bf16_gflops_per_core, 2),
        "cores": peak.cores,
        "name": peak.host,
        "how": peak.how,
    }
    with tempfile.TemporaryDirectory(prefix="meshrun-cpu-runs-") as tmp:
        for row in data["runs"]:
            if only and row["name"] not in only:
                continue
            reps = list((row.get("measured") or {}).get("repeats", [])) if a.append else []
            for _ in range(a.repeats):
                m = measure(row["overrides"], Path(tmp) / f"{row['name']}-{len(reps)}")
                reps.append(m)
                print(
                    f"{row['name']}: {m['step_time_s']:.3f} s (load {m['load_avg_1m']}, "
                    f"other work {m['others_cores']} cores)",
                    flush=True,
                )
            best = min(r["step_time_s"] for r in reps)
            for r in reps:
                r["outlier"] = r["step_time_s"] > 1.25 * best
            row["measured"] = {"step_time_s": best, "repeats": reps}
            row["command"] = shlex.join(command(row["overrides"]))
            # Write after every row: a long session keeps what it measured.
            path.write_text(HEADER + yaml.safe_dump(data, sort_keys=False, width=120))
    return 0


if __name__ == "__main__":
    sys.exit(main())
