"""The launcher's part of ``<run_dir>/run_record.json`` (launcher/config/runrecord.py):
composed config and overrides as typed, the code snapshot, the image, the
data manifest and the parent runs; the job adds its attempts.

The data manifest lists each data file (``data.path``, a file or every file
under a directory; ``job.prompts``, ``job.tokenizer``) with its size and a
content digest (XXH3-128), cached by (size, mtime_ns, inode, ctime_ns) in
the user's own ``<runs_root>/.code/<user>/.datacache.json`` (0600, read only
when it is this user's and writable by nobody else, as the code hash cache:
a teammate who can write the shared runs root cannot steer a recorded data
digest): a big token set is read once, not at every submission.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from pathlib import Path
from typing import Any

from launcher.config.runfiles import SPEC_FILE
from launcher.config.runrecord import write_submission
from launcher.config.spec import RunSpec
from launcher.run import codestore
from launcher.run.codesnap import CodeSnapshot, store_root
from launcher.slurm.container import image_digest, is_local

MAX_DATA_FILES = 100_000  # listed beyond this: the count and a note only
# Set by a submission over SSH (launcher/entry/sshsubmit.py) for the meshrun it
# runs on the login node: "user@host" of the machine it was submitted from.
SUBMITTED_FROM_ENV = "MESHRUN_SUBMITTED_FROM"
# And, for a script job whose project was shipped, a JSON object: that
# machine's job.workdir and job.script, and the overrides as typed there
# (the remote line sets both paths to the shipped project's).
SUBMITTED_PROJECT_ENV = "MESHRUN_SUBMITTED_PROJECT"
_FROM = re.compile(r"^([A-Za-z0-9_][A-Za-z0-9._-]{0,63})@([A-Za-z0-9][A-Za-z0-9._-]{0,252})$")


def submitted_from() -> dict[str, Any] | None:
    """The user and host a submission over SSH came from (with a shipped
    project: its paths there and the overrides as typed); None: submitted here."""
    m = _FROM.match(os.environ.get(SUBMITTED_FROM_ENV, ""))
    if not m:
        return None
    out: dict[str, Any] = {"user": m[1], "host": m[2], "over": "ssh"}
    try:
        there = json.loads(os.environ.get(SUBMITTED_PROJECT_ENV) or "{}")
    except ValueError:
        there = {}
    if isinstance(there, dict):
        out.update({k: there[k] for k in ("workdir", "script") if isinstance(there.get(k), str)})
        typed = there.get("overrides")
        if isinstance(typed, list) and all(isinstance(o, str) for o in typed):
            out["overrides"] = typed
    return out


def _xxh(path: str) -> str:
    import xxhash

    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(8 << 20), b""):
            h.update(block)
    return f"xxh3_128:{h.hexdigest()}"


def _data_paths(spec: RunSpec) -> list[tuple[str, str]]:
    """(field, path) of every local data input."""
    cfg = spec.cfg
    out: list[tuple[str, str]] = []
    if cfg.data.kind != "synthetic" and cfg.data.path:
        out.append(("data.path", cfg.data.path))
    for name in ("prompts", "tokenizer"):
        value = getattr(cfg.job, name, "")
        if value:
            out.append((f"job.{name}", value))
    return out


def data_manifest(spec: RunSpec) -> dict[str, Any]:
    """Each data file's path, size and digest (cached by size, mtime, inode and ctime)."""
    cache_path = codestore.user_store(store_root(spec.cfg)) / codestore.DATA_CACHE
    cache = codestore.read_private_json(cache_path)
    files: list[dict[str, Any]] = []
    truncated = False
    changed = False
    for field, root in _data_paths(spec):
        for path in _files_under(os.path.abspath(root)):
            if len(files) >= MAX_DATA_FILES:
                truncated = True
                break
            st = os.stat(path)
            key = [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]
            hit = cache.get(path)
            if not isinstance(hit, list) or hit[:4] != key or len(hit) != 5:
                hit = [*key, _xxh(path)]
                cache[path] = hit
                changed = True
            files.append({"field": field, "path": path, "size": st.st_size, "digest": hit[4]})
    if changed:
        codestore.ensure_user_store(store_root(spec.cfg))
        codestore.write_private_json(cache_path, cache)
    return {"files": files, "truncated": truncated}


def _files_under(root: str) -> list[str]:
    if os.path.isfile(root):
        return [root]
    out: list[str] = []
    for dirpath, dirnames, names in os.walk(root):
        dirnames.sort()
        out += [os.path.join(dirpath, n) for n in sorted(names)]
    return out


def parents(spec: RunSpec, stage: str = "", after: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The runs this one starts from: a checkpoint, HF weights, a pipeline stage's inputs."""
    j = spec.cfg.job
    out: dict[str, Any] = {}
    if j.checkpoint:
        out["job.checkpoint"] = j.checkpoint
        run = _run_dir_of(j.checkpoint)
        if run:
            out["checkpoint_run"] = run
    if j.hf_path:
        out["job.hf_path"] = j.hf_path
    if stage:
        out["pipeline_stage"] = stage
    if after:
        out["after"] = after
    return out


def _run_dir_of(path: str) -> str | None:
    """The run dir holding a checkpoint path (the nearest parent with a run record or spec)."""
    p = Path(path).resolve()
    for d in [p, *p.parents]:
        if (d / SPEC_FILE).is_file():
            return str(d)
    return None


def image_record(spec: RunSpec) -> dict[str, Any] | None:
    image = spec.cfg.cluster.container_image
    if not image:
        return None
    return {"image": image, "digest": image_digest(image), "local": is_local(image)}


def write_record(
    spec: RunSpec,
    snap: CodeSnapshot,
    overrides: list[str],
    *,
    stage: str = "",
    after: list[dict[str, Any]] | None = None,
) -> None:
    """The launcher's part of the run record (after the run dir is written)."""
    rec = {
        "run_dir": spec.run_dir,
        "run_id": spec.run_id,
        "submitted_at": time.time(),
        "cwd": os.getcwd(),
        "overrides": list(overrides),
        "config": dataclasses.asdict(spec.cfg),
        "code": snap.record(),
        "image": image_record(spec),
        "data": data_manifest(spec),
        "parents": parents(spec, stage, after),
        "submitted_from": submitted_from(),
    }
    write_submission(spec.run_dir, rec)
