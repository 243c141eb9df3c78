"""Job start to first training step in a container, with and without Pyxis
``--container-name`` reuse across the job's steps (preflight, all-reduce,
training), on the local test cluster with real Pyxis.

    eval "$(scripts/testcluster.sh env)"
    python scripts/bench_container.py --image IMAGE.sqsh [--python /usr/bin/python3] [--mount SRC:DST ...]
    python scripts/bench_container.py --quick   # tens of seconds (CI): the test cluster's image, 1 rank

Without reuse every step unpacks the image again. The two jobs run one after
the other (side by side they would share the CPUs). Last line:
``bench_container: noreuse_over_reuse=R`` (start-to-first-step seconds).

``--quick`` builds no image: it reuses the one ``scripts/testcluster.sh
start`` caches ($MESHRUN_TESTCLUSTER_DIR/images/meshrun-test.sqsh, Enroot's
skeleton with the host's /usr and python prefix mounted read-only, as
tests/cluster/test_containers.py runs it) and runs 1 rank instead of 2. That image
is a few KB, so the figure is the steps' container start-up without the
unpack of a real image: the path, not the saving. Still two real jobs,
side by side (sharing the CPUs: the ratio is not the figure): tens of
seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


CLUSTER_DIR = os.environ.get("MESHRUN_TESTCLUSTER_DIR", "/tmp/meshrun-testcluster")
TEST_IMAGE = os.path.join(CLUSTER_DIR, "images", "meshrun-test.sqsh")
TEST_IMAGE_PYTHON = "/opt/meshrun-test/python"  # a wrapper that exists only in the test image


def host_python_mounts() -> list[str]:
    """The host's /usr and this interpreter's prefixes, read-only (the test image has no Python)."""
    prefixes = sorted({sys.base_prefix, sys.prefix})
    return ["/usr:/usr:ro", *[f"{p}:{p}:ro" for p in prefixes if p != "/usr" and not p.startswith("/usr/")]]


def submit_job(
    image: str, python: str, mounts: list[str], reuse: bool, tmp: Path, gpus: int = 2
) -> tuple[str, Path]:
    """Submit the 3-step job with (``reuse``) or without --container-name: (job id, run dir)."""
    from launcher.config import ncclenv as nccl
    from launcher.config.compose import compose
    from launcher.config.spec import RunSpec
    from launcher.plan.make import make_plan
    from launcher.run.rundir import write_run_dir
    from launcher.slurm.render import submitit_parameters, task_command
    from launcher.slurm.submit import _submit

    run_dir = tmp / ("reuse" if reuse else "noreuse")
    mount_list = ",".join(f"'{m}'" for m in mounts)
    cfg = compose(
        [
            "cluster=testcluster", "model=tiny", "launcher.exclusive=false", "qos=training",
            "qos.time_limit_min=15", "launcher.signal_lead_s=30", "cluster.nodes=1", f"cluster.gpus_per_node={gpus}",
            "train.steps=3", "train.log_every_steps=1", "cluster.preflight=true", "cluster.mem_per_node_gb=8",
            "cluster.pyxis=true", f"cluster.container_image={image}", f"cluster.container_python={python}",
            f"cluster.container_mounts=[{mount_list}]", f"+cluster.env.MESHRUN_TEST_PYTHON={sys.executable}",
        ]
    )  # fmt: skip
    nccl.apply(cfg.cluster)
    spec = RunSpec(cfg, make_plan(cfg), str(run_dir))
    write_run_dir(spec)
    params = submitit_parameters(spec, str(run_dir / "slurm"))
    if not reuse:
        params["srun_args"] = [a for a in params["srun_args"] if not a.startswith("--container-name=")]
        params["setup"] = [re.sub(r" --container-name=\S+", "", line) for line in params["setup"]]
    return _submit(spec, run_dir / "slurm", task_command(spec), params), run_dir


def first_step_seconds(job: str, run_dir: Path) -> float:
    """The job's start to its first training step, once seen; the job then ended."""
    from launcher.slurm.cluster import cancel, jobs, run

    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 900
    while not (metrics.exists() and any('"loss"' in x for x in metrics.read_text().splitlines())):
        rec = jobs([job]).get(job)
        assert rec is None or rec.state in ("PENDING", "RUNNING"), (
            f"job {job}: {rec} (logs in {run_dir}/slurm)"
        )
        assert time.monotonic() < deadline, f"job {job} reached no step"
        time.sleep(1)
    start = run(["sacct", "-n", "-X", "-P", "-j", job, "--format=Start"]).stdout.split()[0]
    t_start = datetime.fromisoformat(start).timestamp()
    recs = [json.loads(x) for x in metrics.read_text().splitlines()]
    t_first = min(r["time"] for r in recs if "loss" in r)
    # The first step is all this measures: end the job, and wait for its
    # epilog (container removal) so the next job starts on a quiet node.
    cancel(job)
    while jobs([job])[job].state not in ("CANCELLED", "COMPLETED", "FAILED", "TIMEOUT"):
        time.sleep(2)
    while run(["squeue", "-h", "-j", job], check=False).stdout.strip():
        time.sleep(2)
    return t_first - t_start


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--image", default="", help="the image (required unless --quick)")
    p.add_argument("--python", default="/usr/bin/python3", help="the interpreter inside the image")
    p.add_argument("--mount", action="append", default=[], help="extra SRC:DST[:ro] (repeatable)")
    p.add_argument("--gpus", type=int, default=2, help="ranks (GPUs) on the job's one node")
    p.add_argument("--quick", action="store_true", help="the test cluster's image, 1 rank (CI)")
    args = p.parse_args()
    if args.quick:  # re-parsed so that options given explicitly still win
        p.set_defaults(image=TEST_IMAGE, python=TEST_IMAGE_PYTHON, gpus=1)
        args = p.parse_args()
        args.mount = args.mount or host_python_mounts()
        if not os.path.isfile(args.image):
            print(f"bench_container: no image {args.image} (scripts/testcluster.sh start builds it)")
            return 2
    if not args.image:
        p.error("--image is required (or --quick)")
    how = (args.image, args.python, args.mount)
    with tempfile.TemporaryDirectory(prefix="bench-container-") as tmp:
        if args.quick:  # the path, not the figure: both jobs side by side
            both = [submit_job(*how, reuse, Path(tmp), args.gpus) for reuse in (True, False)]
            reuse, noreuse = (first_step_seconds(*job) for job in both)
        else:
            reuse = first_step_seconds(*submit_job(*how, True, Path(tmp), args.gpus))
            print(f"  with --container-name reuse: {reuse:.1f} s", flush=True)
            noreuse = first_step_seconds(*submit_job(*how, False, Path(tmp), args.gpus))
    print("job start -> first training step (the job runs preflight, all-reduce, training in the container):")
    print(f"  with --container-name reuse:    {reuse:.1f} s")
    print(f"  without (unpack on every step): {noreuse:.1f} s")
    print(f"bench_container: noreuse_over_reuse={noreuse / reuse:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
