"""The rendezvous that outlives a process group: generations in a TCPStore
hosted outside the ranks (the local launcher's store host,
train/inprocess/storehost.py), so losing any rank, rank 0 included, loses
no rendezvous.

Generation g's process group meets under the store prefix ``gen<g>/``. A
rank whose collective fails sets ``fault/<g>`` (every rank's watcher thread
waits on that one key, so the others' blocked collectives are aborted at
once: no rank waits for a timeout; with gloo, whose abort closes nothing,
by shutting the generation's connections down, train/inprocess/sever.py)
and moves the generation to g+1; the
survivors and the replacement meet at g+1 with the same ranks and world
size. Every step here is O(1) store operations a rank: no rank scans the
others.

A hung rank (alive, never leaving its step) is found by the store host
(train/inprocess/missing.py, run by the store host): each rank appends itself
to ``left/<g>`` as it leaves a broken generation and to ``arrived/<g+1>``
as it comes to the next; a rank in neither one collective timeout after
the fault is reported to the launcher, which kills it, and its replacement
takes its rank as a dead one's does."""

from __future__ import annotations

import contextlib
import datetime
import os
import threading
import time
from typing import Any

import torch.distributed as dist

from launcher.config.warmspare import incarnation
from train.inprocess.sever import Links
from train.parallel.dist import DistInfo

STORE_ENV = "MESHRUN_RECOVERY_STORE"  # host:port of the store host
GEN_KEY = "generation"
WORLD_KEY = "world_size"
INCARNATION_PREFIX = "incarnation/"  # + generation/rank: which process of the rank arrived at it
HUNG_PREFIX = "hung/"  # + generation: the ranks the launcher killed as hung before it (the store host's)
MISSING_AFTER_KEY = "missing_after_s"  # the store host's wait before it names a missing rank
CLOSED = b"closed"
_WAIT = datetime.timedelta(days=7)
_FAIL_FAST = datetime.timedelta(milliseconds=1)


def enabled() -> bool:
    return bool(os.environ.get(STORE_ENV))


def is_replacement() -> bool:
    return incarnation() > 0


class Rendezvous:
    """This rank's part in the generations (one per process)."""

    def __init__(self, info: DistInfo, timeout_s: float = 600.0, collective_timeout_s: float = 30.0) -> None:
        host, port = os.environ[STORE_ENV].rsplit(":", 1)
        self.info, self.host, self.port = info, host, int(port)
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.collective_timeout = datetime.timedelta(seconds=collective_timeout_s)
        self.store = self._client(self.timeout)
        # What the store host's missing-rank watch needs (the same values from every rank).
        self.store.set(WORLD_KEY, str(info.world_size))
        # One collective timeout: every survivor reaches a collective within
        # it (a longer step would time its peers out), and the abort ends
        # that collective at once, a queued one too (gloo: the severed
        # connections; before them, such a rank left one timeout late).
        self.store.set(MISSING_AFTER_KEY, str(collective_timeout_s))
        self.gen = -1
        self.arrived_at = 0.0
        self.broken = threading.Event()
        self._watcher: threading.Thread | None = None
        # The generation's gloo connections, shut down at its abort
        # (train/inprocess/sever.py); with NCCL, the peer copies' group's only.
        self.links = Links()

    def _client(self, timeout: datetime.timedelta) -> Any:
        return dist.TCPStore(self.host, self.port, world_size=None, is_master=False, timeout=timeout)

    def current(self) -> int:
        return int(self.store.add(GEN_KEY, 0))

    def first_generation(self) -> int:
        """The generation a starting process joins: 0 at the run's start; a
        replacement joins the one being formed, or, when the newest one
        already formed (it holds the process this one replaces, so it is
        broken), ends that one and joins the next."""
        g = self.current()
        if not is_replacement():
            return g
        if int(self.store.add(f"joined/{g}", 0)) >= self.info.world_size:
            self.flag_fault(g, f"rank {self.info.rank} replaced")
            return g + 1
        return g

    def join(self, gen: int) -> None:
        """Form generation ``gen``'s world process group (blocks until every
        rank joined), then watch its fault key."""
        info = self.info
        self.arrived_at = time.time()  # this rank's part of the recovery's record
        # Before the arrival: a death the launcher saw is this process's only
        # when its incarnation is the one said (train/inprocess/missing.py flag_dead).
        self.store.set(f"{INCARNATION_PREFIX}{gen}/{info.rank}", str(incarnation()))
        self.store.append(f"arrived/{gen}", f"{info.rank},")
        # The generation's groups get a connection of their own: a store
        # wait of a broken generation's group (its timeout drops to 1 ms at
        # an abort) that times out leaves its reply unread on its
        # connection, which must never be the one the next generation reads.
        store = dist.PrefixStore(f"gen{gen}/", self._client(self.timeout))
        self.links.reset()
        if info.backend == "gloo":
            self.links.mark()  # until the first step: every group this generation forms
        dist.init_process_group(
            backend=info.backend,
            store=store,
            rank=info.rank,
            world_size=info.world_size,
            timeout=self.timeout,
        )
        self.links.capture([self.port])  # a fault before the first step: the world group's at least
        self.gen = gen
        self.broken = threading.Event()  # set once this generation's groups are aborted
        self.store.add(f"joined/{gen}", 1)
        self._watcher = threading.Thread(target=self._watch, args=(gen,), name="meshrun-recovery-watch",
                                         daemon=True)  # fmt: skip
        self._watcher.start()

    def gloo_group(self) -> Any:
        """A gloo group of every rank for this generation, its connections
        severed at the abort: with a gloo world they are taken with the rest
        until the first step; with NCCL (its own abort) they are the only ones."""
        if self.info.backend == "gloo":
            return dist.new_group(backend="gloo")
        self.links.mark()
        pg = dist.new_group(backend="gloo")
        self.links.capture([self.port])
        self.links.stop()
        return pg

    def bound_collectives(self, keep_ports: list[int]) -> None:
        """Every group this process holds gets ``launcher.in_process_collective_timeout_s``
        (called once a generation's first step is done: start-up collectives,
        a spawned checkpoint worker's barrier, keep the long one): the abort
        reaches only collectives in flight, and one queued before it keeps
        the timeout it was issued with. The generation's connections are
        taken then (all its groups formed), but for ``keep_ports``' (servers
        of this process that outlive the generation)."""
        for pg in list(dist.distributed_c10d._world.pg_map):
            pg.set_timeout(self.collective_timeout)
        self.links.capture([self.port, *keep_ports])
        self.links.stop()

    def flag_fault(self, gen: int, why: str) -> None:
        """Generation ``gen`` is broken: wake every rank's watcher (their
        blocked collectives abort) and move on to gen + 1 (once, whoever is first)."""
        self.store.compare_set(f"fault/{gen}", "", why)
        self.store.compare_set(GEN_KEY, str(gen), str(gen + 1))

    def hung_before(self, gen: int) -> set[int]:
        """The ranks the launcher killed as hung for generation ``gen`` to form."""
        key = f"{HUNG_PREFIX}{gen}"
        if not self.store.check([key]):
            return set()
        return {int(x) for x in self.store.get(key).decode().split(",") if x.isdigit()}

    def fault_of(self, gen: int) -> str:
        return self.store.get(f"fault/{gen}").decode(errors="replace")

    def _watch(self, gen: int) -> None:
        ws = self._client(_WAIT)  # its own connection: one client is not shared across threads
        ws.wait([f"fault/{gen}"])
        if ws.get(f"fault/{gen}") == CLOSED:
            return
        ws.append(f"aborted/{gen}", f"{self.info.rank},")  # alive (train/inprocess/missing.py)
        self.links.sever()  # first: a peer blocked on this rank fails now too
        abort_all()
        self.broken.set()

    def leave(self, why: str) -> None:
        """After a failed collective: flag the fault, wait for the watcher to
        abort every group, destroy them all."""
        gen = self.gen
        self.store.append(f"left/{gen}", f"{self.info.rank},")
        self.flag_fault(gen, why)
        if self._watcher is not None:
            self._watcher.join()
        destroy_all()

    def close(self) -> None:
        """The run is over (after the last barrier): release every watcher of this generation."""
        if self.gen >= 0:
            self.store.compare_set(f"fault/{self.gen}", "", CLOSED)
        if self._watcher is not None:
            self._watcher.join(timeout=5)


def abort_all() -> None:
    """Abort every process group of this process: collectives blocked on a
    dead peer return with an error instead of waiting for the timeout. An
    abort reaches only the collectives in flight: one issued after it would
    wait the whole timeout (measured with gloo), so the timeout drops to 1 ms
    first and the loop's next collective fails at once too."""
    for pg in list(dist.distributed_c10d._world.pg_map):
        with contextlib.suppress(Exception):  # a group already torn down: nothing to abort
            pg.set_timeout(_FAIL_FAST)
            pg.abort()


def destroy_all() -> None:
    """Forget every process group (the default one last) so a new
    generation can form; never raises (the groups are broken already)."""
    with contextlib.suppress(Exception):  # the world group is broken: forgotten either way
        dist.destroy_process_group()


_ACTIVE: Rendezvous | None = None


def start(info: DistInfo, collective_timeout_s: float) -> Rendezvous:
    """This process's rendezvous: join the run's current generation (a
    replacement: the one being formed for it)."""
    global _ACTIVE
    _ACTIVE = Rendezvous(info, collective_timeout_s=collective_timeout_s)
    _ACTIVE.join(_ACTIVE.first_generation())
    return _ACTIVE


def active() -> Rendezvous | None:
    """The process's rendezvous when launcher.in_process_recovery is on, else None."""
    return _ACTIVE


def finish() -> None:
    """The run's end on every rank: the last barrier, the watchers released, the groups gone."""
    if _ACTIVE is None:
        return
    dist.barrier()
    _ACTIVE.close()
    destroy_all()
