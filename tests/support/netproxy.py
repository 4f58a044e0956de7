"""A fault-injecting TCP proxy for the partition tests (tests/chaos/test_partition.py).

One :class:`NetProxy` listens on a free port of 127.0.0.1 and forwards every connection to one
upstream (PostgreSQL, Redis). The test drives it:

- pass-through (the start): bytes go both ways as they come;
- :meth:`NetProxy.blackhole`: nothing is forwarded any more, in either direction, and nothing is
  closed. Bytes already read are held, the rest stay in the kernel's buffers, a connection
  closed by one side is not closed on the other, and a new connection is accepted but not
  connected upstream. To both ends every connection just hangs, as across a network partition
  whose packets are dropped;
- :meth:`NetProxy.heal`: forwarding resumes, held bytes first. What a client sent into the
  partition reaches the server late, as TCP retransmits it once a partition heals within the
  retransmission timeout: the late acks, releases and writes that owner checks and fencing
  tokens must refuse;
- :meth:`NetProxy.reset` closes every connection (what a client's ``tcp_user_timeout`` or
  keepalive does to a connection whose peer stopped answering).

One daemon thread of the test process moves the bytes (a ``select`` loop; not asyncio: an
event loop in a second thread makes CPython 3.11's ``compile()`` in the main thread fail with
"AST constructor recursion depth mismatch" when pytest rewrites a module afterwards); the
methods are called from the test's thread. Only the standard library: CI needs nothing else.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading

CHUNK = 65536
#: Bytes a connection holds per direction before the proxy stops reading from its sender.
LIMIT = 1 << 20


class _Conn:
    """One proxied connection: the client's socket, the server's (once connected) and what
    each direction holds."""

    def __init__(self, client: socket.socket) -> None:
        self.client = client
        self.server: socket.socket | None = None
        self.up = bytearray()  # client -> server
        self.down = bytearray()  # server -> client
        self.client_eof = self.server_eof = False
        self.shut_up = self.shut_down = False

    def sockets(self) -> list[socket.socket]:
        return [s for s in (self.client, self.server) if s is not None]

    def close(self) -> None:
        for sock in self.sockets():
            with contextlib.suppress(OSError):
                sock.close()


class NetProxy:
    """A TCP proxy to ``(upstream_host, upstream_port)`` on ``127.0.0.1:<port>``."""

    def __init__(self, upstream_host: str, upstream_port: int, *, name: str = "") -> None:
        self.upstream = (upstream_host, int(upstream_port))
        self.name = name or f"{upstream_host}:{upstream_port}"
        #: Bytes that reached the proxy while it was blackholed (both directions), the
        #: connections opened meanwhile, and all connections: what met the partitions.
        self.held_bytes = 0
        self.held_connections = 0
        self.connections = 0
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._conns: list[_Conn] = []
        self._open = threading.Event()
        self._open.set()
        self._stop = threading.Event()
        self._reset = threading.Event()
        self._reset_done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"netproxy:{self.name}",
                                        daemon=True)

    # -- control (from the test's thread) ---------------------------------------------------

    def start(self) -> NetProxy:
        self._listener.listen(64)
        self._listener.setblocking(False)
        self._thread.start()
        return self

    @property
    def blackholed(self) -> bool:
        return not self._open.is_set()

    def blackhole(self) -> None:
        """Stop forwarding in both directions; every connection stays open and hangs."""
        self._open.clear()

    def heal(self) -> None:
        """Forward again, what was held back first."""
        self._open.set()

    def reset(self, timeout: float = 5) -> None:
        """Close every connection (both ends see it closed)."""
        self._reset_done.clear()
        self._reset.set()
        self._reset_done.wait(timeout)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for conn in self._conns:
            conn.close()
        self._conns.clear()
        with contextlib.suppress(OSError):
            self._listener.close()

    def __enter__(self) -> NetProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "blackholed" if self.blackholed else "open"
        return f"<NetProxy {self.name} 127.0.0.1:{self.port} -> {self.upstream} {state}>"

    # -- the thread's side --------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._reset.is_set():
                for conn in self._conns:
                    conn.close()
                self._conns.clear()
                self._reset.clear()
                self._reset_done.set()
            forwarding = self._open.is_set()
            if forwarding:
                self._connect_pending()
            readable: list[socket.socket] = [self._listener]
            writable: list[socket.socket] = []
            for conn in self._conns:
                if not conn.client_eof and len(conn.up) < LIMIT:
                    readable.append(conn.client)
                if conn.server is not None and not conn.server_eof and len(conn.down) < LIMIT:
                    readable.append(conn.server)
                if forwarding and conn.server is not None and conn.up:
                    writable.append(conn.server)
                if forwarding and conn.down:
                    writable.append(conn.client)
            try:
                ready_r, ready_w, _ = select.select(readable, writable, [], 0.05)
            except (OSError, ValueError):  # a socket closed under us: look again
                self._conns = [c for c in self._conns
                               if all(s.fileno() >= 0 for s in c.sockets())]
                continue
            if self._listener in ready_r:
                self._accept()
            for conn in list(self._conns):
                try:
                    self._move(conn, ready_r, ready_w, forwarding)
                except OSError:
                    conn.close()
                    self._conns.remove(conn)

    def _accept(self) -> None:
        with contextlib.suppress(BlockingIOError):
            client, _ = self._listener.accept()
            client.setblocking(False)
            self.connections += 1
            if not self._open.is_set():
                self.held_connections += 1
            self._conns.append(_Conn(client))

    def _connect_pending(self) -> None:
        for conn in list(self._conns):
            if conn.server is None:
                try:
                    conn.server = socket.create_connection(self.upstream, timeout=5)
                    conn.server.setblocking(False)
                except OSError:
                    conn.close()
                    self._conns.remove(conn)

    def _move(self, conn: _Conn, ready_r: list, ready_w: list, forwarding: bool) -> None:
        for sock, buffer, eof in ((conn.client, conn.up, "client_eof"),
                                  (conn.server, conn.down, "server_eof")):
            if sock is not None and sock in ready_r:
                data = sock.recv(CHUNK)
                if not self._open.is_set():  # now, not as the loop began: read after the cut
                    self.held_bytes += len(data)
                if data:
                    buffer += data
                else:
                    setattr(conn, eof, True)
        if not (forwarding and self._open.is_set()):
            return  # a close does not cross a partition either
        if conn.server is not None and conn.server in ready_w and conn.up:
            del conn.up[:conn.server.send(conn.up)]
        if conn.client in ready_w and conn.down:
            del conn.down[:conn.client.send(conn.down)]
        if conn.server is not None and conn.client_eof and not conn.up and not conn.shut_up:
            conn.shut_up = True
            conn.server.shutdown(socket.SHUT_WR)
        if conn.server_eof and not conn.down and not conn.shut_down:
            conn.shut_down = True
            conn.client.shutdown(socket.SHUT_WR)
        if conn.shut_up and conn.shut_down:
            conn.close()
            self._conns.remove(conn)
