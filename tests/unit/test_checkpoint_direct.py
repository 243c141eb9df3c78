"""train/checkpoint/direct.py: the O_DIRECT, hash-as-you-write data file.
Every way of writing (chunk-crossing writes, a partial last block, writes
after an fsync, O_DIRECT refused at open or at write) must leave the same
bytes on disk and the same digest as a plain write of them."""

from __future__ import annotations

import errno
import fcntl
import os
import random
from pathlib import Path

import pytest

from train.checkpoint import direct
from train.checkpoint.direct import CHUNK_BYTES, DirectHashingWriter
from train.checkpoint.manifest import bytes_digest, file_digest, new_hasher


def _pieces(seed: int) -> list[bytes]:
    """Writes as torch.save makes them: small headers, big records, sizes
    that straddle the chunk and end mid-block."""
    rng = random.Random(seed)
    sizes = [30, 64, CHUNK_BYTES - 94, 1, CHUNK_BYTES + 4097, 513, 3 * CHUNK_BYTES // 2, 7]
    return [rng.randbytes(n) for n in sizes]


def _write(path: Path, pieces: list[bytes]) -> DirectHashingWriter:
    with DirectHashingWriter(path, new_hasher()) as w:
        for p in pieces:
            assert w.write(memoryview(p)) == len(p)
            w.flush()  # a no-op: torch.save flushes after every tensor
            assert w.tell() == w.size
    return w


def _o_direct_works(d: Path) -> bool:
    if not getattr(os, "O_DIRECT", 0):
        return False
    try:
        fd = os.open(d / "probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
    except OSError:
        return False
    os.close(fd)
    os.unlink(d / "probe")
    return True


def test_direct_writes_leave_the_bytes_and_digest_of_a_plain_write(tmp_path: Path) -> None:
    pieces = _pieces(0)
    data = b"".join(pieces)
    path = tmp_path / "__0_0.distcp"
    w = DirectHashingWriter(path, new_hasher())
    if _o_direct_works(tmp_path):
        assert w.direct  # this filesystem takes O_DIRECT: the test covers it
    for p in pieces:
        w.write(p)
    if _o_direct_works(tmp_path):
        assert w.direct  # whole chunks went out with O_DIRECT, not yet drained
    w.close()
    w.close()  # twice is harmless
    assert path.read_bytes() == data
    assert w.size == len(data) == path.stat().st_size
    assert w.hexdigest() == bytes_digest(data) == file_digest(path)


def test_fileno_drains_so_fsync_covers_every_byte_and_later_writes_append(tmp_path: Path) -> None:
    path = tmp_path / "f"
    with DirectHashingWriter(path, new_hasher()) as w:
        w.write(b"a" * (CHUNK_BYTES + 100))
        os.fsync(w.fileno())  # as DCP does before closing
        assert path.stat().st_size == CHUNK_BYTES + 100  # nothing held back
        assert not w.direct  # the end is unaligned: buffered from here on
        w.write(b"tail")
    assert path.read_bytes() == b"a" * (CHUNK_BYTES + 100) + b"tail"
    assert w.hexdigest() == bytes_digest(path.read_bytes())


def test_o_direct_refused_at_open_writes_buffered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = os.open

    def no_direct(path: str, flags: int, mode: int = 0o777) -> int:
        if flags & direct._O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")  # as tmpfs did before Linux 6.6
        return real_open(path, flags, mode)

    monkeypatch.setattr(direct.os, "open", no_direct)
    monkeypatch.setattr(direct, "_O_DIRECT", os.O_DIRECT if hasattr(os, "O_DIRECT") else 0o40000)
    pieces = _pieces(1)
    w = _write(tmp_path / "f", pieces)
    assert not w.direct
    assert (tmp_path / "f").read_bytes() == b"".join(pieces)
    assert w.hexdigest() == bytes_digest(b"".join(pieces))


def test_o_direct_refused_at_write_falls_back_without_losing_or_repeating_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not _o_direct_works(tmp_path):
        pytest.skip("this filesystem refuses O_DIRECT at open; the open fallback is tested above")
    real_write = os.write
    refused: list[int] = []

    def refuse_direct(fd: int, data: memoryview) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(len(data))
            raise OSError(errno.EINVAL, "Invalid argument")  # as some FUSE filesystems do
        return real_write(fd, data)

    monkeypatch.setattr(direct.os, "write", refuse_direct)
    pieces = _pieces(2)
    w = _write(tmp_path / "f", pieces)
    assert refused == [CHUNK_BYTES]  # the first chunk, once; buffered after it
    assert (tmp_path / "f").read_bytes() == b"".join(pieces)
    assert w.hexdigest() == bytes_digest(b"".join(pieces))


def test_a_failed_write_is_raised_not_swallowed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int, data: memoryview) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(direct.os, "write", full)
    w = DirectHashingWriter(tmp_path / "f", new_hasher())
    with pytest.raises(OSError, match="No space"):
        w.write(b"x" * (CHUNK_BYTES + 1))
    with pytest.raises(OSError, match="No space"):
        w.close()  # the gathered bytes still fail; the descriptor is closed anyway
    assert w.closed
