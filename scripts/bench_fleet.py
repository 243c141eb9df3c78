"""Bench: ``meshrun fleet`` over a runs root of 200 synthetic run dirs.

    eval "$(scripts/testcluster.sh env)"; python scripts/bench_fleet.py [--runs 200] [--steps 500]
    eval "$(scripts/testcluster.sh env)"; python scripts/bench_fleet.py --quick   # seconds (CI)

Makes the runs root (each run: spec.json, slurm/job.json, a metrics.jsonl of
``--steps`` step records with a resume and checkpoints), pointing the runs
at jobs the cluster's accounting really holds (cycled when there are fewer
than ``--runs``), then times one refresh of the view (every run's
goodput.json computed and written) and counts the Slurm commands it ran.
Prints ``bench_fleet: runs=N seconds=S scheduler_calls=C`` for the first
refresh (every goodput.json computed and written; the target is under 2 s
with one call), then a second refresh's time (the finished runs'
goodput.json are final: read, not recomputed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from launcher.slurm import cluster  # noqa: E402
from launcher.views import fleetrows as fleet  # noqa: E402
from launcher.views import fleettext


def known_jobs(limit: int) -> list[tuple[str, float]]:
    """(job id, start) of finished jobs in the accounting (setup, not timed)."""
    out = cluster.run(
        ["sacct", "-a", "-n", "-P", "-X", "-S", "now-30days", "--format=JobID,Start,State"],
        env={"SLURM_TIME_FORMAT": "%s"},
    )
    jobs = []
    for line in out.stdout.splitlines():
        jid, start, state = line.split("|")
        if state == "COMPLETED" and start.isdigit() and "_" not in jid and "+" not in jid:
            jobs.append((jid, float(start)))
    return jobs[-limit:]


def make_root(root: Path, n: int, steps: int, jobs: list[tuple[str, float]]) -> None:
    for i in range(n):
        jid, t0 = jobs[i % len(jobs)] if jobs else (str(10**7 + i), time.time() - 3600)
        run = root / (f"sweeps/s{i // 20:02d}/{i % 20}" if i % 2 else f"tiny/run{i:03d}")
        (run / "slurm").mkdir(parents=True)
        spec = {
            "version": 1,
            "run_dir": str(run),
            "cfg": {
                "train": {"steps": steps * 2, "global_batch_size": 8},
                "model": {"seq_len": 64},
                "qos": {
                    "qos": ["research", "training"][i % 2],
                    "partition": "research",
                    "account": "research",
                },
                "cluster": {
                    "name": "testcluster",
                    "nodes": 1,
                    "gpus_per_node": 2,
                    "price_on_demand_usd_per_node_hour": 98.32,
                },
            },  # fmt: skip
            "plan": {"global_batch_size": 8},
        }
        (run / "spec.json").write_text(json.dumps(spec))
        (run / "slurm" / "job.json").write_text(json.dumps({"job_id": jid}))
        lines = [json.dumps({"event": "resume", "step": 0, "restore_s": 0.5, "time": t0 + 1})]
        for s in range(1, steps + 1):
            rec = {
                "step": s,
                "loss": 3.0 - s / steps,
                "step_time_s": 0.001,
                "tokens_per_s": 1000.0,
                "time": t0 + 1 + s * 1e-3,
            }
            lines.append(json.dumps(rec))
            if s % 100 == 0:
                lines.append(
                    json.dumps({"event": "checkpoint", "step": s, "save_s": 1e-4, "time": t0 + 1 + s * 1e-3})
                )
        (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    for s in range(n // 40 + 1):
        sweep = root / "sweeps" / f"s{s:02d}"
        if sweep.is_dir():
            pts = [{"point": p.name, "run_dir": str(p)} for p in sorted(sweep.iterdir()) if p.is_dir()]
            (sweep / "manifest.json").write_text(json.dumps({"points": pts}))


# --quick: 40 runs of 100 steps, the same two refreshes and the real accounting.
QUICK = {"runs": 40, "steps": 100}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--quick", action="store_true", help="small sizes: seconds (CI)")
    args = ap.parse_args()
    if args.quick:  # re-parsed so that options given explicitly still win
        ap.set_defaults(**QUICK)
        args = ap.parse_args()
    jobs = known_jobs(args.runs)
    calls: list[list[str]] = []
    real_run = cluster.run

    def counting(argv: list[str], **kw):  # type: ignore[no-untyped-def]
        calls.append(argv)
        return real_run(argv, **kw)

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_root(root, args.runs, args.steps, jobs)
        cluster.run = counting  # type: ignore[assignment]
        try:
            t0 = time.perf_counter()
            view = fleet.collect(root, fleet.Scheduler())
            text = fleettext.format_view(view)
            seconds = time.perf_counter() - t0
            cold_calls = len(calls)
            # A later refresh (a new process: nothing cached in memory): the
            # finished runs' goodput.json are final and only read back.
            t0 = time.perf_counter()
            fleettext.format_view(fleet.collect(root, fleet.Scheduler()))
            warm_s = time.perf_counter() - t0
            warm_calls = len(calls) - cold_calls
        finally:
            cluster.run = real_run  # type: ignore[assignment]
        # The host's speed now (a loaded shared host is several times slower):
        t0 = time.perf_counter()
        sum(range(10**7))
        calib_s = time.perf_counter() - t0
        assert len(view.runs) == args.runs, len(view.runs)
        written = sum(1 for r in view.runs if (Path(r.run_dir) / "goodput.json").exists())
        print(
            f"# {len(jobs)} distinct real jobs, {written} goodput.json written, {len(text.splitlines())} lines, "
            f"scheduler error: {view.scheduler_error}; sum(range(1e7)) took {calib_s:.2f} s here "
            f"(about 0.2 s on an idle core); load average {os.getloadavg()[0]:.1f}",
            file=sys.stderr,
        )
    print(f"bench_fleet: runs={args.runs} seconds={seconds:.2f} scheduler_calls={cold_calls}")
    print(f"bench_fleet: refresh with final goodput.json: seconds={warm_s:.2f} scheduler_calls={warm_calls}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
