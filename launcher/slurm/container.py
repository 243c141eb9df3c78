"""Container images of a run (Pyxis/Enroot): what ``cluster.container_image``
means, checked before anything is submitted, and what the run records.

Pyxis reads an image argument as a local file only when it starts with ``/``
or ``.``; anything else is pulled from a registry. So a relative ``images/x.sqsh``
would silently turn into a Docker Hub download. meshrun therefore:

- treats a value ending in ``.sqsh`` / ``.squashfs``, or starting with ``/``
  or ``.``, as a local file: made absolute and required to exist;
- passes registry references (``nvcr.io#nvidia/pytorch:25.01-py3``,
  ``docker://...``, ``ubuntu:24.04``) through unchanged.

Standard library only (no torch).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from launcher.config.image_ref import is_local
from launcher.config.runfiles import CONTAINER_FILE
from launcher.config.validate import fail

# Written next to an image by ``python -m launcher.image build``: its digest,
# so a submission does not hash gigabytes again.
DIGEST_SUFFIX = ".digest.json"
RECORD_FILE = CONTAINER_FILE
REGISTRY_EXAMPLE = "nvcr.io#nvidia/pytorch:25.01-py3"


def check_image(image: str) -> None:
    """Refuse a local image that is not there, before submission (Pyxis would
    fail only inside every task, after the job waited in the queue)."""
    if not image or not is_local(image):
        return
    if not os.path.isfile(image):
        what = "is a directory, not a .sqsh file" if os.path.isdir(image) else "does not exist"
        raise fail(
            "cluster.container_image",
            image,
            f"the local image {what}; build one with `python -m launcher.image build --base BASE --out "
            f"{image}`, or give a registry reference such as {REGISTRY_EXAMPLE}",
        )


def container_name(image: str) -> str:
    """The Pyxis ``--container-name`` of a run's steps: the preflight steps and
    training reuse one unpacked container instead of unpacking per step.
    Derived from the image (path, size, mtime for a file), so even a site that
    keeps Pyxis' default ``container_scope=global`` never reuses a container
    made from another image."""
    key = image
    if is_local(image) and os.path.isfile(image):
        st = os.stat(image)
        key = f"{image}|{st.st_size}|{int(st.st_mtime)}"
    return "meshrun_" + hashlib.sha256(key.encode()).hexdigest()[:12]


def file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def image_digest(image: str) -> str | None:
    """Content digest of a local image (from its build record when that still
    matches the file, else hashed now); None for a registry reference, which
    enroot resolves at job start."""
    if not is_local(image) or not os.path.isfile(image):
        return None
    sidecar = Path(image + DIGEST_SUFFIX)
    st = os.stat(image)
    if sidecar.exists():
        try:
            rec = json.loads(sidecar.read_text())
            if rec.get("size") == st.st_size and rec.get("mtime") == int(st.st_mtime):
                return str(rec["digest"])
        except (ValueError, KeyError):
            pass  # unreadable record: hash the file instead
    return file_digest(image)


def record(run_dir: str, image: str) -> None:
    """``<run_dir>/container.json``: the image a run's tasks start from."""
    if not image:
        return
    rec = {"image": image, "digest": image_digest(image), "local": is_local(image)}
    Path(run_dir, RECORD_FILE).write_text(json.dumps(rec, indent=2) + "\n")
