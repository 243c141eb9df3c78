"""Benchmark: the checkpoint upload path against raw boto3 on the same server.

Side by side in one run, the same files (a checkpoint-like set of shards) go
to the same loopback S3 server (moto in a subprocess):
- store: ``S3Store.put_files`` as the uploader calls it: SHA-256 checksums
  computed locally, multipart upload with ``ChecksumAlgorithm=SHA256``, then
  every object verified against the checksum S3 kept;
- raw: boto3's transfer manager uploading the same files with the same
  part size and concurrency and boto3's defaults (which, from botocore
  1.36, include a CRC32 request checksum), nothing else.
Runs alternate (raw, store, raw, store, ...) under fresh prefixes.

    python scripts/bench_upload.py [--files 4 --mb 64 --rounds 2]

Last line: ``bench_upload: vs_raw=<store MB/s / raw MB/s>``.
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
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--part-mb", type=int, default=16)
    args = ap.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")

    import boto3
    from boto3.s3.transfer import create_transfer_manager

    from train.checkpoint.manifest import Manifest, describe_files
    from train.checkpoint.store import S3Store

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
        raw_s, store_s = [], []
        for r in range(args.rounds):
            store = S3Store(
                "bench", f"store{r}", endpoint_url=endpoint, threads=args.threads, part_mb=args.part_mb
            )
            t0 = time.perf_counter()
            with create_transfer_manager(store.client, store._transfer_config()) as tm:
                futures = [tm.upload(os.path.join(base, n), "bench", f"raw{r}/{n}") for n in names]
                for fut in futures:
                    fut.result()
            raw_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            assert store.put_files(1, base, names, manifest) == int(total_mb * 1e6)
            store_s.append(time.perf_counter() - t0)
        raw, ours = statistics.median(raw_s), statistics.median(store_s)
        print(
            f"{args.files} files x {args.mb} MB = {total_mb:.0f} MB, {args.threads} threads, {args.part_mb} MB parts"
        )
        print("raw boto3 s:  " + " ".join(f"{t:.2f}" for t in raw_s) + f"  ({total_mb / raw:.0f} MB/s)")
        print("store s:      " + " ".join(f"{t:.2f}" for t in store_s) + f"  ({total_mb / ours:.0f} MB/s)")
        print(f"load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        print(f"bench_upload: vs_raw={raw / ours:.3f}")
    finally:
        moto.kill()
        moto.wait()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
