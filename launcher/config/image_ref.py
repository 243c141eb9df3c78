"""What a ``cluster.container_image`` value means: a file on the cluster's
filesystem (Pyxis reads a value as a file only if it starts with ``/`` or
``.``; meshrun also takes a bare ``.sqsh`` path) or a registry reference."""

from __future__ import annotations

import os

LOCAL_SUFFIXES = (".sqsh", ".squashfs", ".sqfs")


def is_local(image: str) -> bool:
    """Does Pyxis/meshrun read ``image`` as a file on the cluster's filesystem?"""
    return image.startswith(("/", ".")) or image.endswith(LOCAL_SUFFIXES)


def resolve_image(image: str, cwd: str | None = None) -> str:
    """Local paths made absolute (relative to ``cwd``); registry refs unchanged."""
    if not image or not is_local(image):
        return image
    return os.path.normpath(os.path.join(cwd or os.getcwd(), os.path.expanduser(image)))
