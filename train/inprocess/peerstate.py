"""Peer state: each rank's training state in host memory, its own copy (to
roll back to) and its partner's (to hand a replacement), refreshed every
``launcher.peer_copy_every_steps`` steps.

The copy is of this rank's *local* shards (an FSDP2 parameter's
``to_local()``), so it restores only at the layout it was taken at: the same
world size and rank, which is what in-process recovery keeps. The partner is
the rank ``ranks_per_node`` places on (another node), so losing one node
never loses both a state and its copy. The swap with the partner runs on a
thread beside the next step; the capture (a copy in host memory) stays on
the step's path, so the copy is of the state at the step's end."""

from __future__ import annotations

import datetime
import io
import threading
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from launcher.config.plandata import PEER_COPIES_KEPT

# Snapshots kept per kind: the newest and the one before, so a fault during
# an exchange (some ranks hold the new copy, some not) still leaves a step
# every rank holds.
KEEP = PEER_COPIES_KEPT
WAIT_POLL_S = 0.01  # a wait for a swap looks at the abort this often


def partner_offset(world: int, ranks_per_node: int, nodes: int) -> int:
    """How far a rank's partner is: one node over; on a single machine
    (cluster=local) half the ranks over, the pairing 2 nodes would give."""
    off = ranks_per_node if nodes > 1 else world // 2
    if world < 2 or off % world == 0:
        raise ValueError(f"no partner rank for world size {world} with {ranks_per_node} ranks a node")
    return off


def holder_of(rank: int, world: int, off: int) -> int:
    """The rank whose memory holds ``rank``'s copy."""
    return (rank + off) % world


def agreed_step(everyone: list[Any], off: int) -> tuple[int | None, list[int]]:
    """(the newest step every survivor holds its own copy of and every
    replaced rank's holder holds its copy of, or None; the replaced ranks).
    ``everyone``: per rank (own steps, held steps, ...); a replacement holds none."""
    world = len(everyone)
    replaced = [r for r, e in enumerate(everyone) if not e[0]]
    gone = set(replaced)  # one pass over the ranks, no rank scanned twice
    steps: set[int] | None = None
    for r, e in enumerate(everyone):
        if r in gone:
            h = holder_of(r, world, off)
            have = set() if h in gone else set(everyone[h][1])
        else:
            have = set(e[0])
        steps = have if steps is None else steps & have
    return (max(steps) if steps else None), replaced


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def capture(parts: list, optims: list, app_state: dict[str, Any]) -> bytes:
    """This rank's state as bytes: model and optimizer local shards, the LR
    schedule, the data loader's position, the RNG and the progress."""
    with torch.no_grad():
        models = [{k: _local(v).detach().clone() for k, v in p.state_dict().items()} for p in parts]
        opts = []
        for opt in optims:
            sd = opt.state_dict()
            state = {i: {k: (_local(v).clone() if torch.is_tensor(v) else v) for k, v in s.items()}
                     for i, s in sd["state"].items()}  # fmt: skip
            opts.append({"state": state, "param_groups": sd["param_groups"]})
    doc = {
        "model": models,
        "optim": opts,
        "lr_scheduler": app_state["lr_scheduler"].state_dict(),
        "data": app_state["data"].state_dict(),
        "rng": app_state["rng"].state_dict(),
        "progress": app_state["progress"].state_dict(),
    }
    buf = io.BytesIO()
    torch.save(doc, buf)
    return buf.getvalue()


def restore(blob: bytes, parts: list, optims: list, app_state: dict[str, Any]) -> int:
    """Load a :func:`capture` into a trainer built at the same layout; its step."""
    doc = torch.load(io.BytesIO(blob), weights_only=False)
    with torch.no_grad():
        for part, saved in zip(parts, doc["model"], strict=True):
            for k, v in part.state_dict().items():
                _local(v).copy_(saved[k])
        for opt, saved in zip(optims, doc["optim"], strict=True):
            params = [p for g in opt.param_groups for p in g["params"]]
            state = {}
            for i, s in saved["state"].items():
                p = params[int(i)]
                state[i] = {k: _like(p, v) if torch.is_tensor(v) and v.dim() > 0 else v for k, v in s.items()}
            opt.load_state_dict({"state": state, "param_groups": saved["param_groups"]})
    for key in ("lr_scheduler", "data", "rng", "progress"):
        app_state[key].load_state_dict(doc[key])
    return int(doc["progress"]["step"])


def _like(p: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """A saved local shard as the parameter's kind (a DTensor on its mesh);
    a clone: the optimizer must not step the copy itself."""
    local = local.clone()
    if isinstance(p, DTensor):
        return DTensor.from_local(local, p.device_mesh, p.placements, run_check=False, shape=p.shape,
                                  stride=p.stride())  # fmt: skip
    return local


@dataclass
class PeerCopies:
    """This rank's own snapshots and the ones it holds for the rank it is
    partner of, by step (the newest KEEP of each). A swap runs on a thread
    of its own (:meth:`exchange_async`), beside the next step."""

    rank: int
    world: int
    off: int
    own: dict[int, bytes] = field(default_factory=dict)
    held: dict[int, bytes] = field(default_factory=dict)
    # Each point-to-point wait's bound (None: the group's own): a gloo send or
    # receive waits the group's timeout as it was at the group's creation
    # (measured: a receive issued after the fault's abort, from a partner
    # that had left, waited past two collective timeouts), not set_timeout's.
    timeout: datetime.timedelta | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _epoch: int = 0  # a swap started before :meth:`freeze` keeps nothing
    _thread: threading.Thread | None = None
    _error: BaseException | None = None

    @property
    def sends_to(self) -> int:
        return holder_of(self.rank, self.world, self.off)

    @property
    def holds_for(self) -> int:
        return (self.rank - self.off) % self.world

    def bytes_held(self) -> int:
        return sum(map(len, self.own.values())) + sum(map(len, self.held.values()))

    def steps(self) -> tuple[list[int], list[int]]:
        """(the steps of this rank's own copies, of the copies it holds)."""
        with self._lock:
            return sorted(self.own), sorted(self.held)

    def exchange(self, step: int, blob: bytes, group: Any) -> None:
        """Keep ``blob`` as this rank's copy of ``step`` and swap with the
        partners over ``group`` (every rank calls it at the same step)."""
        self.exchange_async(step, blob, group)
        self.wait(threading.Event())

    def exchange_async(self, step: int, blob: bytes, group: Any) -> None:
        """:meth:`exchange` with the swap on a thread: the next step runs
        beside it (:meth:`wait` before the next swap)."""
        with self._lock:
            _keep(self.own, step, blob)
            epoch = self._epoch

        def swap() -> None:
            try:
                got = _swap(blob, self.sends_to, self.holds_for, group, self.timeout)
            except Exception as e:  # a peer gone: the main thread raises it at the next wait
                with self._lock:
                    # ... unless a fault froze this swap: a broken generation's
                    # send can time out after the next one formed (measured: a
                    # recovery in 1 s, then a spurious one at the old send's timeout).
                    if epoch == self._epoch:
                        self._error = e
                return
            with self._lock:
                if epoch == self._epoch:
                    _keep(self.held, step, got)

        self._thread = threading.Thread(target=swap, name="meshrun-peer-copy", daemon=True)
        self._thread.start()

    def wait(self, broken: threading.Event) -> None:
        """The last swap done (its error raised); raises at once when
        ``broken`` (the generation's abort) is set first: a receive from a
        partner that died waits its whole timeout."""
        t = self._thread
        while t is not None and t.is_alive():
            t.join(WAIT_POLL_S)
            if broken.is_set():
                raise RuntimeError("in-process recovery: the peer copy's generation aborted")
        self._thread = None
        if self._error is not None:
            e, self._error = self._error, None
            raise e

    def freeze(self) -> None:
        """At a fault: a swap still running keeps nothing (the copies the
        recovery agrees on stay as they are)."""
        with self._lock:
            self._epoch += 1
        self._thread, self._error = None, None

    def clear(self) -> None:
        self.freeze()
        with self._lock:
            self.own.clear()
            self.held.clear()


def _keep(d: dict[int, bytes], step: int, blob: bytes) -> None:
    d[step] = blob
    for old in sorted(d)[:-KEEP]:
        del d[old]


def _swap(blob: bytes, dst: int, src: int, group: Any, timeout: datetime.timedelta | None) -> bytes:
    """Send ``blob`` to ``dst`` and receive ``src``'s, sizes first (one
    point-to-point pair each way: no collective over the world)."""
    size = torch.tensor([len(blob)], dtype=torch.int64)
    got_size = torch.zeros(1, dtype=torch.int64)
    _p2p([(dist.isend, size, dst), (dist.irecv, got_size, src)], group, timeout)
    out = torch.empty(int(got_size.item()), dtype=torch.uint8)
    _p2p(
        [(dist.isend, torch.frombuffer(bytearray(blob), dtype=torch.uint8), dst), (dist.irecv, out, src)],
        group,
        timeout,
    )
    return out.numpy().tobytes()


def send_copy(blob: bytes, dst: int, group: Any, timeout: datetime.timedelta | None = None) -> None:
    """The held copy to a replacement (rank ``dst``)."""
    _p2p([(dist.isend, torch.tensor([len(blob)], dtype=torch.int64), dst)], group, timeout)
    _p2p([(dist.isend, torch.frombuffer(bytearray(blob), dtype=torch.uint8), dst)], group, timeout)


def recv_copy(src: int, group: Any, timeout: datetime.timedelta | None = None) -> bytes:
    """A replacement's own state, from the rank that held it."""
    size = torch.zeros(1, dtype=torch.int64)
    _p2p([(dist.irecv, size, src)], group, timeout)
    out = torch.empty(int(size.item()), dtype=torch.uint8)
    _p2p([(dist.irecv, out, src)], group, timeout)
    return out.numpy().tobytes()


def _p2p(ops: list[tuple[Any, torch.Tensor, int]], group: Any, timeout: datetime.timedelta | None) -> None:
    # Global ranks: the side group spans the whole world in rank order.
    works = [fn(t, peer, group=group) for fn, t, peer in ops]
    for w in works:
        if timeout is None:
            w.wait()
        else:
            w.wait(timeout)
