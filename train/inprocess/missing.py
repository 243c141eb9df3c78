"""The store host's watch for a hung rank (train/inprocess/storehost.py runs
it on a thread), after each fault, in two looks:

- **Silent**: a rank whose process did not answer the fault at all within
  ``ACK_GRACE_S`` (every live rank's watcher thread appends it to
  ``aborted/<g>`` the moment the fault key is set, whatever its main thread
  is doing), nor left the broken generation (``left/<g>``), nor came to the
  next (``arrived/<g+1>``): stopped, or dead. Said at once.
- **Stuck**: a rank that answered but neither left nor arrived within one
  collective timeout (its main thread wedged where the abort cannot reach).

Each is said as ``missing <g+1> <rank>:<incarnation>,...``, the
incarnation of the rank's process that was in generation g (a bare rank:
none of its processes arrived at g); train/inprocess/rendezvous.py writes
the keys. The launcher kills the named process when it is still the
rank's newest and alive, and leaves a dead one, or a replacement already
started for it (a newer incarnation), be."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from train.inprocess.rendezvous import CLOSED, GEN_KEY, INCARNATION_PREFIX, MISSING_AFTER_KEY, WORLD_KEY

POLL_S = 0.2
# A live process's watcher answers a fault within milliseconds (a store
# append from its own thread); this much leaves room for a loaded host: at
# 1 s, a live survivor on the shared 2-core test host (load average 11-18)
# was once named silent and killed.
ACK_GRACE_S = 2.0


def _ranks(store: Any, key: str) -> set[int]:
    """The ranks appended to ``key`` ("3,0,2,"); none when it is not set."""
    if not store.check([key]):
        return set()
    return {int(x) for x in store.get(key).decode().split(",") if x}


def missing_after_fault(store: Any, gen: int) -> Iterator[tuple[int, list[int]]]:
    """(the next generation, missing ranks), at most twice: the silent ones
    after ``ACK_GRACE_S``, then any others neither in ``left/<gen>`` nor in
    ``arrived/<gen+1>`` once the wait (one collective timeout) is over; nothing
    once that generation formed or failed. Called once ``fault/<gen>`` is set."""
    nxt = gen + 1
    wait_s = float(store.get(MISSING_AFTER_KEY).decode())
    world = set(range(int(store.get(WORLD_KEY).decode())))
    start = time.monotonic()
    named: set[int] | None = None  # the silent ones, once looked for
    while time.monotonic() - start < wait_s:
        if _settled(store, nxt, len(world)):
            return
        if named is None and time.monotonic() - start >= min(ACK_GRACE_S, wait_s / 2):
            gone = _ranks(store, f"left/{gen}") | _ranks(store, f"arrived/{nxt}")
            named = world - gone - _ranks(store, f"aborted/{gen}")
            if named:
                yield nxt, sorted(named)
        time.sleep(POLL_S)
    stuck = world - _ranks(store, f"left/{gen}") - _ranks(store, f"arrived/{nxt}") - (named or set())
    if stuck:
        yield nxt, sorted(stuck)


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
        for nxt, ranks in missing_after_fault(store, gen):
            say(f"missing {nxt} {','.join(_named(store, gen, r) for r in ranks)}")
        gen += 1  # generations are consecutive (Rendezvous.flag_fault)
        while not _settled(store, gen, int(store.get(WORLD_KEY).decode())):
            time.sleep(POLL_S)


def _incarnation_at(store: Any, gen: int, rank: int) -> int | None:
    """The incarnation of the rank's process that arrived at ``gen`` (Rendezvous.join); None when none did."""
    key = f"{INCARNATION_PREFIX}{gen}/{rank}"
    return int(store.get(key)) if store.check([key]) else None


def _named(store: Any, gen: int, rank: int) -> str:
    """``rank:incarnation`` of the rank's process that arrived at ``gen``; the bare rank when none did."""
    inc = _incarnation_at(store, gen, rank)
    return str(rank) if inc is None else f"{rank}:{inc}"


def flag_dead(store: Any, rank: int, incarnation: int) -> bool:
    """The launcher saw ``rank``'s process ``incarnation`` die (0: its first
    process): when that process was a member of the live generation (the
    newest, not flagged yet, arrived at by that very incarnation), flag the
    generation's fault, as a rank whose collective failed would, so every
    watcher aborts now: a survivor blocked on the dead rank where no error
    reaches it (a point-to-point receive posted after the death) leaves at
    once. True when it flagged. The incarnation, not the order of words:
    this word can reach the store after the replacement (a warm spare takes
    the rank in milliseconds) arrived at the next generation under the same
    rank, and that generation must not be broken for a death it never held."""
    gen = int(store.add(GEN_KEY, 0))
    if store.check([f"fault/{gen}"]) or rank not in _ranks(store, f"arrived/{gen}"):
        return False
    if _incarnation_at(store, gen, rank) != incarnation:
        return False  # the rank's newer process arrived at it: the dead one never did
    store.compare_set(f"fault/{gen}", "", f"rank {rank} died (its launcher saw it)")
    store.compare_set(GEN_KEY, str(gen), str(gen + 1))
    return True
