"""A checkpoint data file written with O_DIRECT and hashed as it is written.

A buffered write copies every byte into the page cache (302 MB a save of
the bench's state: most of the worker's CPU, and as much memory traffic
again beside a memory-bound training loop), which the next prune frees
unread. Here bytes gather in one page-aligned chunk that is hashed while it
is hot in cache and handed to the device with O_DIRECT: no page-cache copy.
The chunk's alignment (page) and size (a multiple of 4 KiB) satisfy
O_DIRECT's rules on every block size Linux uses; the file's last partial
block is written through the page cache (O_DIRECT cleared), after which the
file is an ordinary one. Where O_DIRECT is refused (tmpfs before Linux
6.6, some FUSE, older ZFS, platforms without it) the same class writes
buffered.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
from typing import Any

# 4 MiB: large enough that one write a chunk keeps the device busy (1 MiB
# writes cost 20% more CPU and wall time here), small enough to stay in the
# cache between the copy, the hash and the device's read.
CHUNK_BYTES = 4 << 20
_BLOCK = 4096
_O_DIRECT = getattr(os, "O_DIRECT", 0)


class DirectHashingWriter:
    """Write-only, front to back (no seek), like the stream DCP writes each
    data file into. ``flush`` is a no-op (torch.save flushes after every
    tensor; O_DIRECT cannot write a partial block); ``fileno`` and ``close``
    write what is gathered first, so ``os.fsync(w.fileno())`` covers every
    byte written. ``size`` and ``hexdigest()`` describe the bytes written."""

    def __init__(self, path: str | os.PathLike[str], hasher: Any) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
        self._fd = -1
        self.direct = False
        if _O_DIRECT:
            try:
                self._fd = os.open(path, flags | _O_DIRECT, 0o644)
                self.direct = True
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
        if self._fd < 0:
            self._fd = os.open(path, flags, 0o644)
        self._hash = hasher
        # Page-aligned (mmap): O_DIRECT's buffer alignment. None once drained.
        self._chunk = mmap.mmap(-1, CHUNK_BYTES) if self.direct else None
        self._view = memoryview(self._chunk) if self._chunk is not None else None
        self._fill = 0
        self.size = 0
        self.closed = False

    # -- the file API DCP and torch.save use ------------------------------
    def write(self, b: Any) -> int:
        src = memoryview(b).cast("B")
        n = src.nbytes
        if self._view is None:
            _write_all(self._fd, src)
            self._hash.update(src)
        else:
            done = 0
            while done < n:
                k = min(CHUNK_BYTES - self._fill, n - done)
                self._view[self._fill : self._fill + k] = src[done : done + k]
                self._fill += k
                done += k
                if self._fill == CHUNK_BYTES:
                    self._write_chunk(CHUNK_BYTES)
        self.size += n
        return n

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        pass

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        self._drain()
        return self._fd

    def hexdigest(self) -> str:
        return self._hash.hexdigest()

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._drain()
        finally:
            self.closed = True
            os.close(self._fd)

    def __enter__(self) -> DirectHashingWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- internals ------------------------------------------------------------
    def _write_chunk(self, n: int) -> None:
        """Hash and write the first ``n`` gathered bytes (a multiple of the
        block size while O_DIRECT is on); keeps the rest at the front."""
        assert self._view is not None
        view = self._view[:n]
        self._hash.update(view)
        while view.nbytes:
            try:
                view = view[os.write(self._fd, view) :]
            except OSError as e:  # accepted at open, refused at write (some FUSE)
                if e.errno != errno.EINVAL or not self.direct:
                    raise
                self._buffered()
        del view
        rest = self._fill - n
        if rest:
            self._view[:rest] = self._view[n : self._fill]
        self._fill = rest

    def _drain(self) -> None:
        """Write everything gathered; the file is buffered from here on (its
        end is no longer block-aligned)."""
        if self._view is None:
            return
        whole = self._fill - self._fill % _BLOCK
        if whole:
            self._write_chunk(whole)
        self._buffered()
        if self._fill:
            self._write_chunk(self._fill)
        self._view = self._chunk = None  # unmapped with their last reference

    def _buffered(self) -> None:
        if self.direct:
            fcntl.fcntl(self._fd, fcntl.F_SETFL, fcntl.fcntl(self._fd, fcntl.F_GETFL) & ~_O_DIRECT)
            self.direct = False


def _write_all(fd: int, view: memoryview) -> None:
    while view.nbytes:
        view = view[os.write(fd, view) :]
