"""Where each tier lives for a run."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from launcher.config.runid import read_run_id
from train.checkpoint.s3 import S3Store
from train.checkpoint.store import DirStore, Store

_VAR = re.compile(r"\$(?:(\w+)|\{(\w+)\})")


def run_name(spec: Any) -> str:
    """The run's name in shared places (a node's NVMe, Lustre, S3 prefixes):
    its run id (launcher/config/runid.py), unique per run and kept in the run
    directory, so reusing a run directory resumes and nothing else does."""
    run_id = getattr(spec, "run_id", "") or read_run_id(spec.run_dir)
    if not run_id:
        # Every spec the launcher writes has one (save_spec).
        raise ValueError(f"run dir {spec.run_dir} has no run id; start it with python -m launcher")
    return run_id


def expand_local_dir(local_dir: str, env: Mapping[str, str] | None = None) -> str:
    """``storage.local_dir`` as this node sees it: ``~`` and environment
    variables are expanded on the node itself, so one setting can name a
    per-node or per-job directory (``$SLURM_TMPDIR``, ``/nvme/$SLURMD_NODENAME``;
    several nodes of a test cluster on one host, each with its own tier 1)."""
    env = os.environ if env is None else env
    out = _VAR.sub(lambda m: env.get(m.group(1) or m.group(2), m.group(0)), os.path.expanduser(local_dir))
    if "$" in out:
        raise ValueError(
            f"storage.local_dir={local_dir!r}: an environment variable in it is not set on this node "
            f"(expanded to {out!r})"
        )
    return out


def local_root(spec: Any) -> str:
    """Tier 1. ``storage.local_dir`` is shared by every run on a node, so the
    run gets its own subdirectory (retention must never see another run)."""
    local_dir = spec.cfg.storage.local_dir
    if not local_dir:
        return os.path.join(spec.run_dir, "checkpoints")
    return os.path.join(expand_local_dir(local_dir), run_name(spec))


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
                "name an AWS credentials file (storage.s3_credentials_file=<path>, mode 600, AWS_PROFILE "
                "picks its profile) or use an instance role (storage.s3_credentials=role); see docs/security.md"
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
