"""The store host's watch for a hung rank (train/inprocess/storehost.py runs
it on a thread): after a fault, a rank that neither left the broken
generation (``left/<g>``) nor came to the next one (``arrived/<g+1>``)
within one collective timeout is said as ``missing <g+1> <rank>,...``
(train/inprocess/rendezvous.py writes the keys)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from train.inprocess.rendezvous import CLOSED, GEN_KEY, MISSING_AFTER_KEY, WORLD_KEY

POLL_S = 0.2


def _ranks(store: Any, key: str) -> set[int]:
    """The ranks appended to ``key`` ("3,0,2,"); none when it is not set."""
    if not store.check([key]):
        return set()
    return {int(x) for x in store.get(key).decode().split(",") if x}


def missing_after_fault(store: Any, gen: int) -> tuple[int, list[int]] | None:
    """(the next generation, the ranks neither in ``left/<gen>`` nor in
    ``arrived/<gen+1>``), or None when that generation formed or failed
    within the wait. Called once ``fault/<gen>`` is set."""
    nxt = gen + 1
    wait_s = float(store.get(MISSING_AFTER_KEY).decode())
    world = int(store.get(WORLD_KEY).decode())
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        if _settled(store, nxt, world):
            return None
        time.sleep(POLL_S)
    gone = _ranks(store, f"left/{gen}") | _ranks(store, f"arrived/{nxt}")
    return nxt, sorted(set(range(world)) - gone)


def _settled(store: Any, gen: int, world: int) -> bool:
    """Generation ``gen`` formed (every rank joined) or is itself broken."""
    return int(store.add(f"joined/{gen}", 0)) >= world or store.check([f"fault/{gen}"])


def watch_missing(store: Any, say: Callable[[str], None]) -> None:
    """Follow the generations until the run closes one; after each fault
    name the missing ranks once (one store client of its own; O(ranks)
    work only here, in one process, after a fault)."""
    gen = 0
    while True:
        store.wait([f"fault/{gen}"])
        if store.get(f"fault/{gen}") == CLOSED:
            return
        found = missing_after_fault(store, gen)
        if found is not None and found[1]:
            say(f"missing {found[0]} {','.join(map(str, found[1]))}")
        gen += 1  # generations are consecutive (Rendezvous.flag_fault)
        while not _settled(store, gen, int(store.get(WORLD_KEY).decode())):
            time.sleep(POLL_S)


def flag_dead(store: Any, rank: int) -> bool:
    """The launcher saw ``rank``'s process die: when it was a member of the
    live generation (the newest, not flagged yet, ``rank`` arrived at it),
    flag that generation's fault, as a rank whose collective failed would,
    so every watcher aborts now: a survivor blocked on the dead rank where
    no error reaches it (a point-to-point receive posted after the death)
    leaves at once. True when it flagged. The launcher says a death before
    it starts the replacement, so the replacement is never taken for the
    dead process here."""
    gen = int(store.add(GEN_KEY, 0))
    if store.check([f"fault/{gen}"]) or rank not in _ranks(store, f"arrived/{gen}"):
        return False
    store.compare_set(f"fault/{gen}", "", f"rank {rank} died (its launcher saw it)")
    store.compare_set(GEN_KEY, str(gen), str(gen + 1))
    return True
