"""Retention: keep the newest N copies in a tier, deleting an older copy only
once a newer one is complete in that same tier."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from train.checkpoint.manifest import MANIFEST, list_steps, step_dir_name
from train.checkpoint.store import Store

log = logging.getLogger("meshrun.checkpoint")


def select_deletions(
    complete: list[int], present: list[int], keep: int, protected: Iterable[int] = ()
) -> list[int]:
    """Steps to delete: complete ones beyond the newest ``keep``, and
    incomplete leftovers older than the newest complete one (a crashed save or
    an abandoned upload). Nothing newer than the newest complete copy, and
    nothing protected, is touched. Pure function (unit-tested)."""
    assert keep >= 1, keep
    if not complete:
        return []
    keep_set = set(sorted(complete)[-keep:]) | set(protected)
    newest = max(complete)
    return sorted(s for s in present if s < newest and s not in keep_set)


def prune_local(root: str, keep: int, protected: Iterable[int] = ()) -> list[int]:
    complete = list_steps(root)
    present = list_steps(root, complete_only=False)
    victims = select_deletions(complete, present, keep, protected)
    for s in victims:
        path = os.path.join(root, step_dir_name(s))
        # Manifest first: a half-deleted directory must not look complete.
        Path(path, MANIFEST).unlink(missing_ok=True)
        shutil.rmtree(path, ignore_errors=True)
    if victims:
        log.info("checkpoint: removed local copies of steps %s from %s (keep_local=%d)", victims, root, keep)
    return victims


def prune_store(store: Store, keep: int, protected: Iterable[int] = ()) -> list[int]:
    present = store.list_steps()
    complete = [s for s in present if store.get_bytes(s, MANIFEST) is not None]
    victims = select_deletions(complete, present, keep, protected)
    for s in victims:
        store.delete_step(s)
    if victims:
        log.info("checkpoint: removed steps %s from %s (keep=%d)", victims, store.name, keep)
    return victims
