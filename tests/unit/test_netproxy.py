"""The partition tests' TCP proxy (tests/support/netproxy.py) against a local echo server:
pass-through, blackhole (nothing forwarded, nothing closed), heal (what was held arrives
late), reset."""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Iterator

import pytest

from tests.support.netproxy import NetProxy


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(4096):
            self.request.sendall(data)


@pytest.fixture
def proxy() -> Iterator[NetProxy]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    with NetProxy(*server.server_address, name="echo") as proxy:
        yield proxy
    server.shutdown()
    server.server_close()


def _connect(proxy: NetProxy) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=0.3)


def _read(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        out += sock.recv(n - len(out))
    return out


def test_blackhole_holds_every_byte_and_heal_delivers_them_late(proxy):
    with _connect(proxy) as sock:
        sock.sendall(b"ping")
        assert _read(sock, 4) == b"ping"
        proxy.blackhole()
        sock.sendall(b"late")
        with pytest.raises(TimeoutError):  # no answer, and no close either
            sock.recv(4)
        with _connect(proxy) as newcomer:  # accepted, then nothing
            newcomer.sendall(b"new")
            with pytest.raises(TimeoutError):
                newcomer.recv(3)
            assert proxy.held_bytes == 7 and proxy.held_connections == 1
            proxy.heal()
            assert _read(sock, 4) == b"late"
            assert _read(newcomer, 3) == b"new"
        sock.sendall(b"again")
        assert _read(sock, 5) == b"again"


def test_a_close_does_not_cross_the_blackhole(proxy):
    with _connect(proxy) as sock:
        proxy.blackhole()
        sock.sendall(b"bye")
        sock.shutdown(socket.SHUT_WR)
        with pytest.raises(TimeoutError):
            sock.recv(3)
        proxy.heal()  # the echo server gets the bytes and the end, answers, closes
        assert _read(sock, 3) == b"bye"
        assert sock.recv(1) == b""


def test_reset_closes_every_connection(proxy):
    with _connect(proxy) as sock:
        sock.sendall(b"x")
        assert _read(sock, 1) == b"x"
        proxy.reset()
        try:
            assert sock.recv(1) == b""
        except ConnectionResetError:
            pass
