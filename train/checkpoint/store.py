"""Remote checkpoint stores: tier 2 (a shared filesystem) and tier 3 (S3).

Both hold ``<root>/step_<N>/<file>`` like tier 1, plus per-node completion
markers ``step_<N>/_nodes/node_<k>.json``. A store only moves and verifies
bytes; the protocol (markers, manifest last, retention) is in
:mod:`train.checkpoint.upload`.

Credentials for S3 come only from boto3's default chain (environment
variables, ``AWS_PROFILE`` / shared config, instance roles); nothing here
reads, logs or stores them. ``boto3`` is imported where used.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from train.checkpoint.manifest import (
    MANIFEST,
    FileEntry,
    Manifest,
    file_sha256,
    parse_step_dir,
    step_dir_name,
)

log = logging.getLogger("meshrun.checkpoint")

NODES_DIR = "_nodes"


def node_marker_name(node: int) -> str:
    return f"{NODES_DIR}/node_{node}.json"


class StoreError(RuntimeError):
    """A transfer or verification failed (retryable)."""


class Store:
    """Interface; paths inside a step are '/'-separated relative names."""

    name: str  # for logs: never contains credentials
    tier: str  # "shared" | "s3"

    def put_files(self, step: int, local_dir: str, names: list[str], manifest: Manifest) -> int:
        """Copy ``names`` of a local checkpoint, verify each copy; skip files
        already present and verified. Returns bytes transferred."""
        raise NotImplementedError

    def put_bytes(self, step: int, name: str, data: bytes) -> None:
        raise NotImplementedError

    def get_bytes(self, step: int, name: str) -> bytes | None:
        raise NotImplementedError

    def delete(self, step: int, name: str) -> None:
        raise NotImplementedError

    def list_names(self, step: int, under: str = "") -> list[str]:
        raise NotImplementedError

    def list_steps(self) -> list[int]:
        """Steps with any object, ascending."""
        raise NotImplementedError

    def fetch_files(self, step: int, names: list[str], dest_dir: str, manifest: Manifest) -> None:
        """Download into ``dest_dir`` (temp name, then rename) and check each
        file's sha256 against the manifest; raises StoreError on a mismatch."""
        raise NotImplementedError

    def delete_step(self, step: int) -> None:
        """Delete one checkpoint, manifest first, so a partly deleted copy is
        never mistaken for a complete one."""
        raise NotImplementedError

    def read_manifest(self, step: int) -> Manifest | None:
        data = self.get_bytes(step, MANIFEST)
        if data is None:
            return None
        try:
            return Manifest.from_json(data.decode())
        except (ValueError, TypeError, KeyError):
            log.warning("checkpoint: %s step %d has an unreadable manifest; ignoring it", self.name, step)
            return None

    def complete_steps(self) -> list[int]:
        return [s for s in self.list_steps() if self.get_bytes(s, MANIFEST) is not None]


def _check_fetched(path: Path, name: str, entry: FileEntry, where: str) -> None:
    size = path.stat().st_size
    if size != entry.size:
        raise StoreError(f"{where}/{name}: downloaded {size} bytes, manifest says {entry.size}")
    if file_sha256(path) != entry.sha256:
        raise StoreError(f"{where}/{name}: downloaded copy fails its sha256 check")


class DirStore(Store):
    """Tier 2: a directory on a shared filesystem (Lustre, NFS)."""

    tier = "shared"

    def __init__(self, root: str, threads: int = 4):
        self.root = Path(root)
        self.name = str(root)
        self.threads = threads

    def _p(self, step: int, name: str = "") -> Path:
        return self.root / step_dir_name(step) / name

    def _copy_verified(self, src: Path, dst: Path, entry: FileEntry) -> int:
        if dst.exists() and dst.stat().st_size == entry.size and file_sha256(dst) == entry.sha256:
            return 0
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f".{dst.name}.part{os.getpid()}")
        shutil.copyfile(src, tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        _check_fetched(tmp, dst.name, entry, self.name)
        os.replace(tmp, dst)
        return entry.size

    def put_files(self, step: int, local_dir: str, names: list[str], manifest: Manifest) -> int:
        with ThreadPoolExecutor(self.threads) as pool:
            jobs = [
                pool.submit(self._copy_verified, Path(local_dir) / n, self._p(step, n), manifest.files[n])
                for n in names
            ]
            return sum(j.result() for j in jobs)

    def put_bytes(self, step: int, name: str, data: bytes) -> None:
        from train.checkpoint.manifest import atomic_write_bytes

        p = self._p(step, name)
        p.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(p, data)

    def get_bytes(self, step: int, name: str) -> bytes | None:
        try:
            return self._p(step, name).read_bytes()
        except OSError:
            return None

    def delete(self, step: int, name: str) -> None:
        self._p(step, name).unlink(missing_ok=True)

    def list_names(self, step: int, under: str = "") -> list[str]:
        base = self._p(step)
        d = base / under if under else base
        if not d.is_dir():
            return []
        return sorted(str(p.relative_to(base)) for p in d.rglob("*") if p.is_file())

    def list_steps(self) -> list[int]:
        if not self.root.is_dir():
            return []
        return sorted(s for n in os.listdir(self.root) if (s := parse_step_dir(n)) is not None)

    def fetch_files(self, step: int, names: list[str], dest_dir: str, manifest: Manifest) -> None:
        def one(n: str) -> None:
            dst = Path(dest_dir) / n
            tmp = dst.with_name(f".{dst.name}.part{os.getpid()}")
            try:
                shutil.copyfile(self._p(step, n), tmp)
            except OSError as e:
                raise StoreError(f"{self.name}: cannot read {step_dir_name(step)}/{n}: {e}") from e
            _check_fetched(tmp, n, manifest.files[n], f"{self.name}/{step_dir_name(step)}")
            os.replace(tmp, dst)

        with ThreadPoolExecutor(self.threads) as pool:
            for j in [pool.submit(one, n) for n in names]:
                j.result()

    def delete_step(self, step: int) -> None:
        self._p(step, MANIFEST).unlink(missing_ok=True)
        shutil.rmtree(self._p(step), ignore_errors=True)


def expected_sha256_checksum(path: str | os.PathLike[str], size: int, threshold: int, chunksize: int) -> str:
    """The SHA-256 checksum S3 stores for an object uploaded by boto3's
    transfer manager with ``ChecksumAlgorithm='SHA256'`` and this
    threshold/chunk size: base64 SHA-256 of the bytes, or for multipart
    uploads (a composite checksum) of the parts' SHA-256 digests, plus
    ``-<parts>``. S3 computes it from what it received, whatever the bucket's
    encryption (unlike the ETag, an MD5 only without SSE-KMS / SSE-C and
    on some S3-compatible stores), so a match verifies every byte without
    downloading the object."""
    from s3transfer.utils import ChunksizeAdjuster

    with open(path, "rb") as f:
        if size < threshold:
            h = hashlib.sha256()
            while chunk := f.read(8 << 20):
                h.update(chunk)
            return base64.b64encode(h.digest()).decode()
        part = ChunksizeAdjuster().adjust_chunksize(chunksize, size)
        digests = []
        while chunk := f.read(part):
            digests.append(hashlib.sha256(chunk).digest())
    return f"{base64.b64encode(hashlib.sha256(b''.join(digests)).digest()).decode()}-{len(digests)}"


def checksum_matches(stored: str | None, expected: str) -> bool:
    """A stored ChecksumSHA256 against an expected one. Composite values are
    ``<base64>-<parts>``; some servers omit the ``-<parts>`` suffix."""
    if not stored:
        return False
    value, _, parts = stored.partition("-")
    want, _, want_parts = expected.partition("-")
    return value == want and (not parts or parts == want_parts)


class S3Store(Store):
    """Tier 3: ``s3://<bucket>/<prefix>/step_<N>/...`` through boto3's
    transfer manager (multipart, concurrent parts and files, retries)."""

    tier = "s3"

    def __init__(
        self,
        bucket: str,
        prefix: str,
        *,
        endpoint_url: str = "",
        region: str = "us-east-1",
        threads: int = 8,
        part_mb: int = 16,
        connect_timeout_s: float = 5.0,
        client: Any = None,
    ):
        import boto3
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.name = f"s3://{bucket}/{self.prefix}"
        self.threads = threads
        self.part_bytes = max(5, part_mb) << 20  # S3's minimum part size is 5 MiB
        self.threshold = self.part_bytes
        if client is None:
            # boto3's default credential chain; never passed in from config.
            session = boto3.session.Session()
            client = session.client(
                "s3",
                endpoint_url=endpoint_url or None,
                region_name=region or None,
                config=Config(
                    connect_timeout=connect_timeout_s,
                    read_timeout=60,
                    retries={"max_attempts": 3, "mode": "standard"},
                    max_pool_connections=max(10, threads * 2),
                ),
            )
        self.client = client
        self._warned_no_checksum = False

    def _key(self, step: int, name: str = "") -> str:
        return f"{self.prefix}/{step_dir_name(step)}/{name}"

    def _transfer_config(self) -> Any:
        from boto3.s3.transfer import TransferConfig

        return TransferConfig(
            multipart_threshold=self.threshold,
            multipart_chunksize=self.part_bytes,
            max_concurrency=self.threads,
            use_threads=True,
        )

    def _head_checksum(self, key: str) -> tuple[dict[str, Any] | None, str | None]:
        """(head, stored SHA-256 checksum or None); (None, None) if absent."""
        from botocore.exceptions import ClientError

        try:
            head = self.client.head_object(Bucket=self.bucket, Key=key, ChecksumMode="ENABLED")
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None, None
            raise
        return head, head.get("ChecksumSHA256")

    def _verified(self, key: str, entry: FileEntry, checksum: str) -> tuple[bool, str]:
        """Whether the object holds exactly the file's bytes: by the SHA-256
        checksum S3 computed on receipt or, on stores that keep no additional
        checksums, by reading the object back. (ok, what was seen)."""
        head, stored = self._head_checksum(key)
        if head is None:
            return False, "no object"
        if head.get("ContentLength") != entry.size:
            return False, f"{head.get('ContentLength')} bytes"
        if stored:
            return checksum_matches(stored, checksum), f"sha256 checksum {stored}"
        if not self._warned_no_checksum:
            self._warned_no_checksum = True
            log.warning(
                "checkpoint: %s keeps no SHA-256 checksums; verifying uploads by reading them back", self.name
            )
        h = hashlib.sha256()
        body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"]
        while chunk := body.read(8 << 20):
            h.update(chunk)
        return h.hexdigest() == entry.sha256, "read back"

    def put_files(self, step: int, local_dir: str, names: list[str], manifest: Manifest) -> int:
        from boto3.s3.transfer import create_transfer_manager

        sums = {}
        todo = []
        for n in names:
            entry = manifest.files[n]
            path = os.path.join(local_dir, n)
            sums[n] = expected_sha256_checksum(path, entry.size, self.threshold, self.part_bytes)
            if not self._verified(self._key(step, n), entry, sums[n])[0]:
                todo.append(n)
        if not todo:
            return 0
        # One transfer manager for all files: parts of several files in flight.
        # S3 checks each part's SHA-256 on receipt and keeps the object's.
        with create_transfer_manager(self.client, self._transfer_config()) as tm:
            futures = [
                tm.upload(
                    os.path.join(local_dir, n),
                    self.bucket,
                    self._key(step, n),
                    extra_args={
                        "Metadata": {"sha256": manifest.files[n].sha256},
                        "ChecksumAlgorithm": "SHA256",
                    },
                )
                for n in todo
            ]
            for f in futures:
                f.result()
        for n in todo:
            ok, seen = self._verified(self._key(step, n), manifest.files[n], sums[n])
            if not ok:
                raise StoreError(
                    f"{self.name}/{step_dir_name(step)}/{n}: uploaded object does not verify "
                    f"({seen}; expected {manifest.files[n].size} bytes, sha256 checksum {sums[n]})"
                )
        return sum(manifest.files[n].size for n in todo)

    def put_bytes(self, step: int, name: str, data: bytes) -> None:
        checksum = base64.b64encode(hashlib.sha256(data).digest()).decode()
        key = self._key(step, name)
        resp = self.client.put_object(
            Bucket=self.bucket, Key=key, Body=data, ChecksumAlgorithm="SHA256", ChecksumSHA256=checksum
        )
        # S3 rejects a body that does not match the checksum sent with it; a
        # store that keeps no checksums is checked by reading the object back.
        stored = resp.get("ChecksumSHA256")
        if stored:
            ok = checksum_matches(stored, checksum)
        else:
            ok = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read() == data
        if not ok:
            raise StoreError(f"{self.name}/{step_dir_name(step)}/{name}: object does not verify after upload")

    def get_bytes(self, step: int, name: str) -> bytes | None:
        from botocore.exceptions import ClientError

        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(step, name))["Body"].read()
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise

    def delete(self, step: int, name: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(step, name))

    def _list(self, prefix: str, delimiter: str = "") -> tuple[list[str], list[str]]:
        keys, prefixes = [], []
        kw = {"Bucket": self.bucket, "Prefix": prefix}
        if delimiter:
            kw["Delimiter"] = delimiter
        for page in self.client.get_paginator("list_objects_v2").paginate(**kw):
            keys += [o["Key"] for o in page.get("Contents", [])]
            prefixes += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
        return keys, prefixes

    def list_names(self, step: int, under: str = "") -> list[str]:
        base = self._key(step)
        keys, _ = self._list(base + under)
        return sorted(k[len(base) :] for k in keys)

    def list_steps(self) -> list[int]:
        _, prefixes = self._list(self.prefix + "/", "/")
        steps = (parse_step_dir(p.rstrip("/").rsplit("/", 1)[-1]) for p in prefixes)
        return sorted(s for s in steps if s is not None)

    def fetch_files(self, step: int, names: list[str], dest_dir: str, manifest: Manifest) -> None:
        from boto3.s3.transfer import create_transfer_manager
        from botocore.exceptions import BotoCoreError, ClientError

        where = f"{self.name}/{step_dir_name(step)}"
        tmps = {n: os.path.join(dest_dir, f".{n}.part{os.getpid()}") for n in names}
        try:
            with create_transfer_manager(self.client, self._transfer_config()) as tm:
                futures = [tm.download(self.bucket, self._key(step, n), tmps[n]) for n in names]
                for f in futures:
                    f.result()
        except (BotoCoreError, ClientError, OSError) as e:
            raise StoreError(f"{where}: download failed: {e}") from e
        for n in names:
            _check_fetched(Path(tmps[n]), n, manifest.files[n], where)
            os.replace(tmps[n], os.path.join(dest_dir, n))

    def delete_step(self, step: int) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(step, MANIFEST))
        keys, _ = self._list(self._key(step))
        for i in range(0, len(keys), 1000):
            self.client.delete_objects(
                Bucket=self.bucket,
                Delete={"Objects": [{"Key": k} for k in keys[i : i + 1000]], "Quiet": True},
            )


def build_stores(storage: Any, run_name: str) -> list[Store]:
    """Tier 2 and tier 3 stores from a StorageConfig, in upload order."""
    stores: list[Store] = []
    threads = max(1, int(getattr(storage, "upload_threads", 8)))
    if storage.shared_dir:
        stores.append(DirStore(os.path.join(storage.shared_dir, run_name), threads=min(threads, 4)))
    if storage.s3_bucket:
        endpoint = storage.s3_endpoint_url
        if "@" in endpoint.split("//", 1)[-1].split("/", 1)[0]:
            raise ValueError(
                "storage.s3_endpoint_url must not contain credentials (user:secret@host); "
                "set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE in the environment"
            )
        stores.append(
            S3Store(
                storage.s3_bucket,
                f"{storage.s3_prefix.strip('/')}/{run_name}" if storage.s3_prefix.strip("/") else run_name,
                endpoint_url=endpoint,
                region=storage.s3_region,
                threads=threads,
                part_mb=int(getattr(storage, "upload_part_mb", 16)),
            )
        )
    return stores
