"""``<run_dir>/goodput.json`` as a contract: its name, its buckets and the
Prometheus series it is exported as. Standard library only: the launcher
(``launcher/views/goodput.py``) computes and writes it; the trainer's exporter
(``train/observe/metrics.py``) serves it while the run runs, ``meshrun fleet --prom``
for every run."""

from __future__ import annotations

from typing import Any

# degraded: GPU-seconds held but not trained on (a shrink with no spare left,
# spares waiting), never productive. recovery: an in-process recovery, from
# the fault to the first resumed step (launcher.in_process_recovery).
BUCKETS = (
    "startup", "restore", "productive", "checkpoint_stall", "redone", "hang_restart", "recovery", "idle_end",
    "degraded",
)  # fmt: skip
# Exported series (dashboards/meshrun.json uses them; tests/local/test_ops_dashboard.py checks).
SERIES = {
    "gpu_seconds": "meshrun_goodput_gpu_seconds",  # label bucket=...
    "allocated": "meshrun_allocated_gpu_seconds",
    "ettr": "meshrun_ettr_ratio",
    "queue_wait": "meshrun_queue_wait_seconds",
    "redone_steps": "meshrun_redone_steps",
    "restarts": "meshrun_restarts",
}
HELP = {
    "gpu_seconds": "Allocated GPU-seconds of the run by goodput bucket (meshrun fleet).",
    "allocated": "GPU-seconds allocated to the run by Slurm, all its starts.",
    "ettr": "Effective training time ratio: productive / allocated GPU-seconds.",
    "queue_wait": "Seconds the run's job waited in the queue, all its starts.",
    "redone_steps": "Training steps run again after a failure or preemption.",
    "restarts": "Starts of the run's job after its first (requeues).",
}


def samples(g: dict[str, Any]) -> list[tuple[str, dict[str, str], float]]:
    """(series key, extra labels, value) of one goodput.json, in export order."""
    out: list[tuple[str, dict[str, str], float]] = [
        ("gpu_seconds", {"bucket": k}, float(v)) for k, v in g["buckets_gpu_s"].items()
    ]
    out += [
        ("allocated", {}, float(g["allocated_gpu_s"])),
        ("queue_wait", {}, float(g["queue_wait_s"])),
        ("redone_steps", {}, float(g["steps"]["redone"])),
        ("restarts", {}, float(g["restarts"])),
    ]
    if g.get("ettr") is not None:
        out.append(("ettr", {}, float(g["ettr"])))
    return out
