"""Benchmark: the checkpoint upload path against raw boto3 on the same server.

Side by side in one run, the same files (a checkpoint-like set of shards) go
to the same loopback S3 server (moto in a subprocess), with clients of the
same configuration, the same part size and concurrency:
- store: ``S3Store.put_files`` as the uploader calls it: a HEAD per file,
  each part read once and SHA-256-hashed (part checksum and the file's
  digest, checked against the manifest) right before it is sent,
  multipart upload with those checksums, then every object verified;
- raw: boto3's transfer manager uploading the same files with a SHA-256
  request checksum per part (``ChecksumAlgorithm=SHA256``), nothing else.

Both sides sign the same way. Over plain http botocore signs a request's
body with SigV4 (a second SHA-256 pass over every byte) unless told not to;
the store may sign the requests that carry its checksum ``UNSIGNED-PAYLOAD``.
Every PutObject / UploadPart request of both sides is recorded as sent
(``x-amz-content-sha256``: a body hash, ``UNSIGNED-PAYLOAD``, or a streaming
form); the raw side is signed the way the store's first round was, and a
run whose two sides signed differently stops without a ratio. The ratio
therefore compares the store's extra work (HEADs, its own hashing and
digest check, verification) with a plain transfer that hashes and signs the
same bytes the same way, not with one that pays a body hash the other skips.

Rounds alternate which side goes first (raw, store / store, raw / ...);
each round's objects are deleted afterwards (untimed) so the server's state
does not grow. Reported per side: wall seconds per round, the median
throughput, and this process's CPU seconds (all threads; the server's are
not counted), the per-round ratio, and the load average before and after,
since the cores may be shared.

    python scripts/bench_upload.py [--files 4 --mb 64 --rounds 6]
    python scripts/bench_upload.py --quick   # seconds (CI)

Last line: ``bench_upload: vs_raw=<store MB/s / raw MB/s> signing=<how both
signed>`` (medians of wall time per round).
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench_checkpoint import _free_port, _start_moto  # noqa: E402

HEX64 = re.compile(r"^[0-9a-f]{64}$")


def record_signing(counts: Counter[str], request: Any, **_: Any) -> None:
    """botocore before-send handler: how a request's body was signed."""
    value = request.headers.get("x-amz-content-sha256", b"")
    value = value.decode() if isinstance(value, bytes) else str(value)
    if value == "UNSIGNED-PAYLOAD":
        counts["unsigned payload"] += 1
    elif HEX64.match(value):
        counts["body hashed (SigV4)"] += 1
    elif value.startswith("STREAMING-"):
        counts["streaming"] += 1
    else:
        counts[f"other: {value or 'no header'}"] += 1


# --quick: 2 files of 8 MB in 5 MB parts (S3's smallest; still multipart), 2 rounds.
QUICK = {"files": 2, "mb": 8, "rounds": 2, "threads": 4, "part_mb": 5}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--mb", type=int, default=64, help="size of each file")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--part-mb", type=int, default=16)
    ap.add_argument("--quick", action="store_true", help="small sizes: seconds (CI)")
    args = ap.parse_args()
    if args.quick:  # re-parsed so that options given explicitly still win
        ap.set_defaults(**QUICK)
        args = ap.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")

    import boto3
    from boto3.s3.transfer import create_transfer_manager
    from botocore.config import Config

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
        # Its own client, of the same configuration: the store's signing
        # handlers (if any) stay on the store's client.
        raw_client = boto3.client(
            "s3", endpoint_url=endpoint, region_name="us-east-1", config=store.client.meta.config
        )
        signed: dict[str, Counter[str]] = {"raw": Counter(), "store": Counter()}
        for side, client in (("raw", raw_client), ("store", store.client)):
            for op in ("PutObject", "UploadPart"):
                client.meta.events.register(
                    f"before-send.s3.{op}",
                    functools.partial(record_signing, signed[side]),
                    unique_id=f"rec-{op}",
                )
        raw_signs_payload: list[bool | None] = [None]  # decided from the store's first round

        def sign_like_store(request: Any, **_: Any) -> None:
            if raw_signs_payload[0] is None:
                return
            config = request.context.get("client_config")
            if config is not None:
                s3 = {**(config.s3 or {}), "payload_signing_enabled": raw_signs_payload[0]}
                request.context["client_config"] = config.merge(Config(s3=s3))

        for op in ("PutObject", "UploadPart"):
            raw_client.meta.events.register(f"before-sign.s3.{op}", sign_like_store, unique_id=f"like-{op}")

        def raw(r: int) -> None:
            with create_transfer_manager(raw_client, store._transfer_config()) as tm:
                futures = [
                    tm.upload(
                        os.path.join(base, n),
                        "bench",
                        f"raw{r}/{n}",
                        extra_args={"ChecksumAlgorithm": "SHA256"},
                    )
                    for n in names
                ]
                for fut in futures:
                    fut.result()

        def ours(r: int) -> None:
            s = S3Store("bench", f"store{r}", client=store.client, threads=args.threads, part_mb=args.part_mb)
            assert s.put_files(1, base, names, manifest) == sum(e.size for e in files.values())

        sides = {"raw": raw, "store": ours}
        wall: dict[str, list[float]] = {"raw": [], "store": []}
        cpu: dict[str, list[float]] = {"raw": [], "store": []}
        # An untimed store round: how the store signs (then the raw side
        # signs the same way), and the server's first-touch costs.
        ours(-1)
        kinds = set(signed["store"])
        if not kinds or len(kinds) > 1 or kinds <= {"streaming"}:
            print(
                f"bench_upload: the store's requests were signed {dict(signed['store'])}: no single way to copy"
            )
            return 1
        raw_signs_payload[0] = kinds == {"body hashed (SigV4)"}
        signed["store"].clear()
        keys = [
            o["Key"]
            for o in store.client.list_objects_v2(Bucket="bench", Prefix="store-1/").get("Contents", [])
        ]
        store.client.delete_objects(Bucket="bench", Delete={"Objects": [{"Key": k} for k in keys]})
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
        for side in ("raw", "store"):
            print(f"{side} requests (PutObject/UploadPart) as signed: {dict(signed[side])}")
        if set(signed["raw"]) != set(signed["store"]):
            print("bench_upload: the two sides signed differently; no ratio")
            return 1
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
        how = "+".join(sorted(signed["store"]))
        print(f"bench_upload: vs_raw={med['raw'] / med['store']:.3f} signing={how.replace(' ', '_')}")
    finally:
        moto.kill()
        moto.wait()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
