"""Benchmark: the checkpoint upload path against raw boto3 on the same server.

Side by side in one run, the same files (a checkpoint-like set of shards) go
to the same loopback S3 server (moto in a subprocess), with the same boto3
client, part size and concurrency:
- store: ``S3Store.put_files`` as the uploader calls it: a HEAD per file,
  each part read once and SHA-256-hashed (part checksum and the file's
  whole sha256, checked against the manifest) right before it is sent,
  multipart upload with those checksums, then every object verified
  against the checksum S3 kept (HEAD with ChecksumMode=ENABLED);
- raw: boto3's transfer manager uploading the same files with boto3's
  defaults (which, from botocore 1.36, include a CRC32 request checksum),
  nothing else.
Rounds alternate which side goes first (raw, store / store, raw / ...);
each round's objects are deleted afterwards (untimed) so the server's state
does not grow. Reported per side: wall seconds per round, the median
throughput, and this process's CPU seconds (all threads; the server's are
not counted), the per-round ratio, and the load average before and after,
since the cores may be shared.

    python scripts/bench_upload.py [--files 4 --mb 64 --rounds 6]

Last line: ``bench_upload: vs_raw=<store MB/s / raw MB/s>`` (medians).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench_checkpoint import _free_port, _start_moto  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--mb", type=int, default=64, help="size of each file")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--part-mb", type=int, default=16)
    args = ap.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")

    import boto3
    from boto3.s3.transfer import create_transfer_manager

    from train.checkpoint.manifest import Manifest, describe_files
    from train.checkpoint.s3 import S3Store

    port = _free_port()
    moto = _start_moto(port)
    endpoint = f"http://127.0.0.1:{port}"
    base = tempfile.mkdtemp(prefix="bench_upload_")
    try:
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="bench")
        names = [f"__{i}_0.distcp" for i in range(args.files)]
        for n in names:
            with open(os.path.join(base, n), "wb") as f:
                for _ in range(args.mb):
                    f.write(os.urandom(1 << 20))
        files = describe_files(base, names, rank=0)
        manifest = Manifest(step=1, config_hash="b", world_size=1, mesh={}, rank_nodes=[0], files=files)
        total_mb = sum(e.size for e in files.values()) / 1e6
        store = S3Store("bench", "store", endpoint_url=endpoint, threads=args.threads, part_mb=args.part_mb)

        def raw(r: int) -> None:
            with create_transfer_manager(store.client, store._transfer_config()) as tm:
                futures = [tm.upload(os.path.join(base, n), "bench", f"raw{r}/{n}") for n in names]
                for fut in futures:
                    fut.result()

        def ours(r: int) -> None:
            s = S3Store("bench", f"store{r}", client=store.client, threads=args.threads, part_mb=args.part_mb)
            assert s.put_files(1, base, names, manifest) == sum(e.size for e in files.values())

        sides = {"raw": raw, "store": ours}
        wall: dict[str, list[float]] = {"raw": [], "store": []}
        cpu: dict[str, list[float]] = {"raw": [], "store": []}
        load0 = os.getloadavg()
        for r in range(args.rounds):
            for side in ("raw", "store") if r % 2 == 0 else ("store", "raw"):
                c0, t0 = time.process_time(), time.perf_counter()
                sides[side](r)
                wall[side].append(time.perf_counter() - t0)
                cpu[side].append(time.process_time() - c0)
            for prefix in (f"raw{r}/", f"store{r}/"):
                keys = [
                    o["Key"] for o in store.client.list_objects_v2(Bucket="bench", Prefix=prefix)["Contents"]
                ]
                store.client.delete_objects(Bucket="bench", Delete={"Objects": [{"Key": k} for k in keys]})
        load1 = os.getloadavg()
        med = {k: statistics.median(v) for k, v in wall.items()}
        print(
            f"{args.files} files x {args.mb} MB = {total_mb:.0f} MB, {args.threads} threads, "
            f"{args.part_mb} MB parts, {args.rounds} rounds"
        )
        for side in ("raw", "store"):
            print(
                f"{side + ' s:':10s}"
                + " ".join(f"{t:.2f}" for t in wall[side])
                + f"  (median {total_mb / med[side]:.0f} MB/s; client CPU s median "
                f"{statistics.median(cpu[side]):.2f})"
            )
        print(
            f"load average (1/5/15 min): before {load0[0]:.1f}/{load0[1]:.1f}/{load0[2]:.1f}, "
            f"after {load1[0]:.1f}/{load1[1]:.1f}/{load1[2]:.1f}, on {os.cpu_count()} cores"
        )
        # Each round's two runs are adjacent in time: their ratio drifts less
        # with other load on shared cores than the medians do.
        paired = sorted(a / b for a, b in zip(wall["raw"], wall["store"], strict=True))
        print(
            f"per-round raw/store: median {statistics.median(paired):.3f} "
            f"(min {paired[0]:.3f}, max {paired[-1]:.3f})"
        )
        print(f"bench_upload: vs_raw={med['raw'] / med['store']:.3f}")
    finally:
        moto.kill()
        moto.wait()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
