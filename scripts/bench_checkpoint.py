"""Benchmark: what checkpointing adds to the training loop's wall time.

Side by side in one run, same model, optimizer, state and disk, the same
loop of ``--steps`` steps is timed four ways: without saves; with a tiered
save (``CheckpointManager.save``: staging into shared memory in the trainer,
then DCP write, hashing, manifest and retention in the rank's checkpoint
worker process) at the start of every ``--every`` steps to the node-local
tier only, the tier the blocking save writes to; the same with the verified
S3 upload added (moto's server in a subprocess); and with a blocking
``torch.distributed.checkpoint.save`` of the same state at the same steps
(pruned to the same 2 copies, so both write into recycled page cache). By
default a loop is one save interval (10 steps, a save after the first):
the four loops run in ``--rounds`` rounds, each in a rotated order, and
each round's paths are compared with that round's no-save loop, so a
comparison spans seconds, not minutes (this host drifts by 10-30% over
minutes); the figures are medians over rounds, with the rounds' spread
printed. Each path saves 3 times untimed first (worker start, buffers,
first plan, page cache). It runs once with 1 rank (one compute thread: a
core of this machine stays free, as on a GPU node whose host CPUs mostly
wait for the GPUs) and once with 2 ranks (FSDP2 over gloo, one thread
each: no core is free).

The added wall time per save is (loop time with saves - loop time without)
/ saves (in the same round), so it counts everything a save costs the loop: the time save()
blocks, the optimizer step held for staging, the slowdown of the interval's
later steps while the background work competes for the cores and memory,
and the wait for the commit at the loop's end. It is reported signed, as
measured: a negative figure means the saves cost less than this host's
noise between two loops, and is never rounded up to 0. The S3 path counts
its upload too: its loop time runs until the upload of the loop's last save
has finished (the upload's tail after the loop is printed apart), so the
upload's share is in its figure, an upper bound of what a loop that waited
for nothing would lose. A save every 10 steps leaves
the background time to finish a save before the next one: saved more often
than the disk and the hashing can absorb, every save waits for the
previous one, async or not. On a 2-core host the moto server's request
handling (work S3's machines would do) runs on the training cores, which
does not keep it off the loop's critical path here; that is why the S3
figure is reported beside the headline, not in it.

    python scripts/bench_checkpoint.py [--dim 2048 --layers 6 --steps 10 --every 10 --rounds 9 --ranks 1,2]
    python scripts/bench_checkpoint.py --quick   # seconds (CI)

``--quick``: 2 x Linear(512), 1 rank, 2 rounds of 4-step loops, the same
four paths and lines; at that size a ratio may read n/a (the saves are
within the noise), which --quick does not count as a failure.

Last line: ``bench_checkpoint: blocked_ratio=<tiered (node-local) added s
per save / blocking added s per save, medians of rounds, signed, the worse
of the rank counts> with_s3=<tiered with the S3 upload, its tail included,
over the same blocking figure> per_ranks=<N:ratio,...>``. A ratio is "n/a"
when the blocking saves themselves added nothing measurable.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_moto(port: int) -> subprocess.Popen:
    # SCHED_IDLE: the store's own CPU work is not part of the node's cost.
    proc = subprocess.Popen(
        ["chrt", "--idle", "0", sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1)
            return proc
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("moto server did not start") from None
            time.sleep(0.2)


def _rank_main(args: argparse.Namespace) -> int:
    """One rank of the benchmark (a subprocess); rank 0 prints a JSON line."""
    logging.basicConfig(level=logging.WARNING)
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from ckpt_drill import build_model

    from launcher.config.schema import ClusterConfig, RunConfig, StorageConfig, TrainConfig
    from launcher.config.spec import RunSpec
    from launcher.plan.make import make_plan
    from train.checkpoint import CheckpointManager
    from train.checkpoint.manifest import read_manifest
    from train.loop.state import ModelState, OptimState
    from train.parallel.dist import DistInfo

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    port = int(os.environ["MASTER_PORT"])
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)

    def spec_for(bucket: str, name: str) -> RunSpec:
        cfg = RunConfig(
            cluster=ClusterConfig(local_processes=world),
            storage=StorageConfig(
                save_every_steps=10**9,
                keep_local=2,
                keep_remote=2,
                s3_bucket=bucket,
                s3_endpoint_url=args.endpoint if bucket else "",
            ),
            train=TrainConfig(steps=10**6),
        )
        return RunSpec(
            cfg=cfg,
            plan=make_plan(cfg),
            run_dir=os.path.join(args.base, name),
            run_id=f"{args.run_id}-{name}",
        )

    info = DistInfo(rank, world, rank, world, 0, "cpu", "gloo", "127.0.0.1", port)
    model = build_model(args.dim, args.layers, world)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    app_state = {"model": ModelState([model]), "optim": OptimState([model], [opt])}
    x = torch.randn(16, args.dim)

    def one_step() -> None:
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()

    def loop(save: Any) -> float:
        if world > 1:
            dist.barrier()
        t0 = time.perf_counter()
        for step in range(1, args.steps + 1):
            one_step()
            # A save at the start of each interval of --every steps: the
            # interval's later steps run beside its background work, and
            # its commit is waited for at the loop's end (tiered()).
            if save is not None and (step - 1) % args.every == 0:
                save(step)
        return time.perf_counter() - t0

    for _ in range(2):  # warm-up; the optimizer state exists from here on
        one_step()
    # Two tiered managers on the same disk: node-local only (the same tier
    # as the blocking save) and node-local + S3 upload.
    disk = CheckpointManager(spec_for("", "disk"), info)
    s3 = CheckpointManager(spec_for("bench", "s3"), info)
    managers = {"disk": disk, "s3": s3}
    offset = 10**6

    worker_cpu: dict[str, list[float]] = {"disk": [], "s3": []}
    upload_tail: dict[str, float] = {}  # path -> seconds its last upload ran past the loop (this round)

    def cpu_s(pid: int) -> float:
        """User + system CPU seconds of a process so far (/proc/<pid>/stat)."""
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def tiered(name: str, first: int) -> float:
        ckpt = managers[name]
        pid = ckpt.worker.proc.pid
        c0, t0 = cpu_s(pid), time.perf_counter()
        loop(lambda step: ckpt.save(first + step, app_state))
        ckpt._wait_pending()  # the last commit is part of what the loop waits for
        t_loop = time.perf_counter() - t0
        # The upload is part of the save's cost: the loop's time runs until
        # the last save's upload has finished (and it must not run into the
        # next path's loop).
        assert ckpt.wait_uploads(600), "upload did not finish"
        t = time.perf_counter() - t0
        upload_tail[name] = t - t_loop
        # The worker's CPU per save (upload included): what the background
        # takes from the loop's cores, far less noisy than wall time here.
        worker_cpu[name].append((cpu_s(pid) - c0) / saves)
        return t

    blocking_dirs: list[str] = []

    def blocking(step: int) -> None:
        path = os.path.join(args.base, "blocking", f"step_{step}")
        dcp.save(app_state, checkpoint_id=path, no_dist=world == 1)
        # The tiered saves' retention (keep_local=2): both paths write into
        # recycled page cache, not into memory the VM touches for the first time.
        blocking_dirs.append(path)
        if rank == 0:
            while len(blocking_dirs) > 2:
                shutil.rmtree(blocking_dirs.pop(0), ignore_errors=True)

    saves = _saves(args)
    # Untimed first saves: buffers, the workers' start, the first plan and
    # the page cache the later saves recycle are one-off costs.
    for ckpt in managers.values():
        for k in range(3):
            ckpt.save(offset - 3 + k, app_state)
    assert s3.wait_uploads(600), "upload did not finish"
    for k in range(3):
        blocking(-k)

    def timed(name: str, first: int) -> float:
        if name == "none":
            return loop(None)
        if name == "blocking":
            return loop(lambda step: blocking(first + step))
        return tiered(name, first)

    # Rounds of all four paths, each round in a rotated order: a path's
    # added time is taken against the no-save loop of its own round, so
    # the host's drift over minutes cancels; medians over rounds drop the
    # round a neighbour's burst landed in.
    paths = ["none", "disk", "blocking", "s3"]
    rounds = []
    for r in range(args.rounds):
        first = offset + r * args.steps
        order = paths[r % 4 :] + paths[: r % 4]
        times = {name: timed(name, first) for name in order}
        times["s3_tail"] = upload_tail["s3"]
        rounds.append(times)
    last_step = offset + (args.rounds - 1) * args.steps + (saves - 1) * args.every + 1
    timed_saves = saves * args.rounds
    calls = {name: statistics.mean(c.blocked_s[-timed_saves:]) for name, c in managers.items()}
    disk.finalize(timeout_s=600)
    report = s3.finalize(timeout_s=600)
    if rank == 0:
        manifest = read_manifest(os.path.join(s3.root, f"step_{last_step}"))
        assert manifest is not None, "the last tiered save did not commit"
        print(
            json.dumps(
                {
                    "state_mb": manifest.total_bytes / 1e6,
                    "rounds": rounds,
                    "save_call_s": calls,
                    "worker_cpu_s": {k: statistics.median(v) for k, v in worker_cpu.items()},
                    "upload_mb": report.get("upload_mb", 0.0),
                    "upload_mb_per_s": report.get("upload_mb_per_s", 0.0),
                    "load": os.getloadavg()[0],
                }
            ),
            flush=True,
        )
    if world > 1:
        dist.destroy_process_group()
    return 0


def _saves(args: argparse.Namespace) -> int:
    """Saves in one loop: at steps 1, 1 + every, ... <= steps."""
    return len(range(1, args.steps + 1, args.every))


def run_ranks(cmd: list[str], world: int) -> str:
    """Run ``cmd`` as ``world`` ranks on this machine (RANK / WORLD_SIZE /
    MASTER_ADDR / MASTER_PORT set); returns the last line rank 0 printed."""
    port = _free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1")
        env["MASTER_PORT"] = str(port)
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE if rank == 0 else None, text=True))
    out, _ = procs[0].communicate()
    codes = [procs[0].returncode] + [p.wait() for p in procs[1:]]
    if any(codes):
        raise RuntimeError(f"{world}-rank benchmark failed: exit codes {codes}")
    return out.strip().splitlines()[-1]


def _run(args: argparse.Namespace, world: int, endpoint: str, base: str) -> dict[str, Any]:
    from launcher.config.runid import new_run_id

    run_id = new_run_id(f"bench-ckpt-{world}")
    cmd = [sys.executable, os.path.abspath(__file__), "--rank-main", "--endpoint", endpoint]
    cmd += ["--base", os.path.join(base, f"w{world}"), "--run-id", run_id]
    cmd += ["--dim", str(args.dim), "--layers", str(args.layers)]
    cmd += ["--steps", str(args.steps), "--every", str(args.every), "--rounds", str(args.rounds)]
    return json.loads(run_ranks(cmd, world))


# --quick's sizes: the same paths and report, seconds instead of minutes.
QUICK = {"dim": 512, "layers": 2, "steps": 4, "every": 4, "rounds": 2, "ranks": "1"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--steps", type=int, default=10, help="steps in each loop")
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=9, help="rounds of the four loops (medians over rounds)")
    ap.add_argument("--ranks", default="1,2", help="rank counts to run, e.g. 1,2")
    ap.add_argument("--dir", default="", help="disk to save to (default: a temp dir)")
    ap.add_argument("--quick", action="store_true", help="small sizes: seconds (CI)")
    ap.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--endpoint", default="", help=argparse.SUPPRESS)
    ap.add_argument("--base", default="", help=argparse.SUPPRESS)
    ap.add_argument("--run-id", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:  # re-parsed so that options given explicitly still win
        ap.set_defaults(**QUICK)
        args = ap.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    if args.rank_main:
        return _rank_main(args)

    import boto3

    port = _free_port()
    moto = _start_moto(port)
    endpoint = f"http://127.0.0.1:{port}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="bench")
    base = tempfile.mkdtemp(prefix="bench_ckpt_", dir=args.dir or None)
    ratios: list[float] = []
    s3_ratios: list[float] = []
    worlds = [int(w) for w in args.ranks.split(",")]
    try:
        for world in worlds:
            r = _run(args, world, endpoint, base)
            saves = _saves(args)
            per_round = [
                {k: (t[k] - t["none"]) / saves for k in ("disk", "s3", "blocking")} for t in r["rounds"]
            ]
            added = {k: statistics.median(a[k] for a in per_round) for k in ("disk", "s3", "blocking")}
            print(
                f"{world} rank(s), 1 thread each: {args.layers} x Linear({args.dim}, {args.dim}) + AdamW, "
                f"{r['state_mb']:.0f} MB per checkpoint; {args.rounds} rounds of 4 loops of {args.steps} steps, "
                f"a save every {args.every} ({saves} save(s) a loop, from its first step)"
            )
            for i, (t, a) in enumerate(zip(r["rounds"], per_round, strict=True)):
                print(
                    f"  round {i + 1}: loop s no saves {t['none']:.2f}, tiered {t['disk']:.2f} (+ S3 {t['s3']:.2f}, "
                    f"of which the upload's tail after the loop {t['s3_tail']:.2f}), blocking {t['blocking']:.2f}; "
                    f"added s per save: tiered {a['disk']:+.3f}, + S3 {a['s3']:+.3f}, blocking {a['blocking']:+.3f}"
                )
            tail = statistics.median(t["s3_tail"] for t in r["rounds"]) / saves
            print(
                f"  added s per save, median of rounds (signed): tiered {added['disk']:+.3f} "
                f"(save() itself {r['save_call_s']['disk']:.3f}), tiered + S3 upload {added['s3']:+.3f} "
                f"(upload tail after the loop {tail:.3f}; save() itself {r['save_call_s']['s3']:.3f}), "
                f"blocking {added['blocking']:+.3f}"
            )
            print(
                f"  rank 0's checkpoint worker, CPU s per save (median of rounds): node-local "
                f"{r['worker_cpu_s']['disk']:.3f}, with the S3 upload {r['worker_cpu_s']['s3']:.3f}"
            )
            print(
                f"  upload (rank 0's node): {r['upload_mb']:.0f} MB at {r['upload_mb_per_s']:.0f} MB/s; "
                f"load average {r['load']:.1f} on {os.cpu_count()} cores"
            )
            if added["blocking"] <= 0:
                print(
                    f"  {world} rank(s): the blocking saves cost nothing measurable; the machine is too noisy"
                )
                ratios.append(float("nan"))
                s3_ratios.append(float("nan"))
                continue
            ratio = added["disk"] / added["blocking"]
            s3_ratio = added["s3"] / added["blocking"]
            spread = [a["disk"] / a["blocking"] for a in per_round if a["blocking"] > 0]
            print(
                f"  {world} rank(s): blocked_ratio={ratio:+.3f} (rounds {min(spread):+.3f}-{max(spread):+.3f}; "
                f"with the S3 upload: {s3_ratio:+.3f})"
            )
            ratios.append(ratio)
            s3_ratios.append(s3_ratio)
    finally:
        moto.kill()
        moto.wait()
        shutil.rmtree(base, ignore_errors=True)

    def worst_of(values: list[float]) -> float:
        return float("nan") if any(v != v for v in values) else max(values)

    def fmt(v: float) -> str:
        return "n/a" if v != v else f"{v:+.3f}"

    worst = worst_of(ratios)
    per = ",".join(f"{w}:{fmt(r)}" for w, r in zip(worlds, ratios, strict=True))
    print(f"bench_checkpoint: blocked_ratio={fmt(worst)} with_s3={fmt(worst_of(s3_ratios))} per_ranks={per}")
    return 0 if worst == worst or args.quick else 1


if __name__ == "__main__":
    sys.exit(main())
