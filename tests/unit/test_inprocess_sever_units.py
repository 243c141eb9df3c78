"""gloo's abort, as train/inprocess/sever.py does it: the connections a
process opened while a generation's groups formed are shut down at the
abort, so the peer's blocked receive ends at once; listening sockets and
connections on a kept port (the store host, the checkpoint worker's
store) are left alone, and a descriptor number reused meanwhile is never
touched."""

from __future__ import annotations

import os
import socket
import threading
import time

from train.inprocess.sever import Links


def _pair(server: socket.socket) -> tuple[socket.socket, socket.socket]:
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    return client, accepted


def test_the_generations_connections_are_shut_and_a_blocked_peer_wakes() -> None:
    kept_server = socket.create_server(("127.0.0.1", 0))
    old, _ = _pair(kept_server)  # open before the generation: not its
    links = Links()
    links.mark()
    server = socket.create_server(("127.0.0.1", 0))  # listening: never shut
    mine, theirs = _pair(server)
    kept, kept_peer = _pair(kept_server)  # on a kept port (a store): left alone
    links.capture([kept_server.getsockname()[1]])
    assert set(links.fds) == {mine.fileno(), theirs.fileno()}
    got: list[bytes] = []
    # The peer (here: the accepted end) blocked in a receive, as a gloo pair waiting for data.
    reader = threading.Thread(target=lambda: got.append(theirs.recv(1)))
    reader.start()
    time.sleep(0.1)
    assert links.sever() == 2
    reader.join(5)  # its receive has no timeout: only the shutdown ends it
    assert not reader.is_alive() and got == [b""]
    # Left alone: the kept connection still carries data, the listener still accepts.
    kept.sendall(b"x")
    assert kept_peer.recv(1) == b"x"
    c2, a2 = _pair(server)
    for s in (old, server, mine, theirs, kept, kept_peer, kept_server, c2, a2):
        s.close()


def test_a_number_reused_by_another_socket_is_not_shut() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    links = Links()
    links.mark()
    a, b = _pair(server)
    links.capture([])
    fd = a.detach()
    assert fd in links.fds
    other, other_peer = _pair(server)  # opened after the capture: not the generation's
    os.dup2(other.fileno(), fd)  # gloo closed fd (a failed pair) and the number now names this socket
    assert links.sever() == 1  # b's end only
    assert b.recv(1) == b""
    other.sendall(b"y")  # the socket behind the reused number still carries data
    assert other_peer.recv(1) == b"y"
    os.close(fd)
    for s in (b, other, other_peer, server):
        s.close()


def test_nothing_is_captured_unmarked_or_after_the_stop() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    links = Links()
    links.capture([])  # never marked (NCCL's world: its own abort)
    a, b = _pair(server)
    links.capture([])
    assert links.fds == {}
    links.mark()
    links.stop()
    c, d = _pair(server)
    links.capture([])
    assert links.fds == {} and links.sever() == 0
    for s in (a, b, c, d, server):
        s.close()
