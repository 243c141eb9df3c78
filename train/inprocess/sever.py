"""A broken generation's gloo connections, shut down at its abort.

gloo's ``abort()`` closes no connection: a survivor blocked on a live peer
(a point-to-point send waiting for its partner's receive, a collective whose
neighbours left on another connection) waits out its collective timeout,
measured as the floor of a recovery (5.2-5.6 s with a 5 s timeout). NCCL's
abort ends every operation of its communicator; this is gloo's equivalent:
each rank remembers the TCP connections its process opened while the
generation's groups formed, and shuts them down (``shutdown(SHUT_RDWR)``)
when the generation is aborted, so every operation on them, in flight or
queued, fails at once on both ends.

Which connections: the sockets this process opened from :meth:`Links.mark`
to :meth:`Links.capture` (the generation's groups: their sockets connect at
creation), minus listening sockets and any with an end on a kept port (the
store host, the checkpoint worker's store, the metrics server). A socket is
shut down only while its descriptor still names the same socket (checked on
a duplicate, so a number reused meanwhile is never touched). Linux only
(``/proc``); elsewhere nothing is captured and the timeouts stay the bound.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterable

_LISTEN = "0A"  # /proc/net/tcp's state column


def _sockets() -> dict[int, int]:
    """fd -> socket inode, for this process's open sockets."""
    out: dict[int, int] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError, ValueError):
                target = os.readlink(f"/proc/self/fd/{name}")
                if target.startswith("socket:["):
                    out[int(name)] = int(target[8:-1])
    return out


def _tcp() -> dict[int, tuple[int, int, str]]:
    """inode -> (local port, remote port, state) of this network namespace's TCP sockets."""
    out: dict[int, tuple[int, int, str]] = {}
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            next(f, None)
            for line in f:
                cols = line.split()
                with contextlib.suppress(IndexError, ValueError):
                    local, remote = int(cols[1].rsplit(":", 1)[1], 16), int(cols[2].rsplit(":", 1)[1], 16)
                    out[int(cols[9])] = (local, remote, cols[3])
    return out


class Links:
    """One generation's connections to shut down at its abort."""

    def __init__(self) -> None:
        self._before: dict[int, int] | None = None
        self.fds: dict[int, int] = {}  # fd -> socket inode

    def reset(self) -> None:
        """A new generation: nothing captured, nothing being captured."""
        self._before, self.fds = None, {}

    def mark(self) -> None:
        """The sockets open now are not the generation's."""
        self._before = _sockets()

    def capture(self, keep_ports: Iterable[int]) -> None:
        """Add the TCP connections opened since :meth:`mark` (none when not marked)."""
        if self._before is None:
            return
        keep, tcp = {p for p in keep_ports if p}, _tcp()
        for fd, inode in _sockets().items():
            if self._before.get(fd) == inode or inode not in tcp:
                continue
            local, remote, state = tcp[inode]
            if state != _LISTEN and local not in keep and remote not in keep:
                self.fds[fd] = inode

    def stop(self) -> None:
        """Capture no more this generation (what is captured stays)."""
        self._before = None

    def sever(self) -> int:
        """Shut every captured connection down; the number shut."""
        done = 0
        for fd, inode in list(self.fds.items()):  # a copy: the main thread may be capturing still
            try:
                dup = os.dup(fd)
            except OSError:
                continue  # closed already (gloo closes a pair that failed)
            try:
                if os.fstat(dup).st_ino == inode:
                    with socket.socket(fileno=dup) as s:
                        dup = -1  # the socket object owns it now
                        s.shutdown(socket.SHUT_RDWR)
                        done += 1
            except OSError:
                pass  # not connected any more: nothing to shut
            finally:
                if dup >= 0:
                    os.close(dup)
        self.fds = {}
        return done
