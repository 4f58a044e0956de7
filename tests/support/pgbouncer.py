"""A private PgBouncer in transaction pooling mode in front of the test's PostgreSQL server.

:class:`PgBouncer` writes an ini and a user list in a temporary directory, starts the Debian
package's ``pgbouncer`` on a free port (as ``postgres`` when run by root: it refuses root),
and stops it at teardown, waiting until PostgreSQL has ended the server connections it held
(so pytest-django can drop the test database after it). The pool is small (two server
connections for many clients), so clients really do share server connections between
transactions: any session state would leak from one client to another, or be missing.
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg

POOL_SIZE = 2


def version() -> tuple[int, ...]:
    """The installed pgbouncer's version, e.g. ``(1, 18, 0)``."""
    out = subprocess.run([shutil.which("pgbouncer") or "pgbouncer", "--version"],
                         capture_output=True, text=True, timeout=30).stdout
    match = re.search(r"PgBouncer (\d+)\.(\d+)(?:\.(\d+))?", out)
    return tuple(int(part or 0) for part in match.groups()) if match else (0,)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PgBouncer:
    """``pgbouncer`` in front of ``host:port`` (PostgreSQL, trust authentication)."""

    def __init__(self, *, host: str, port: int, user: str) -> None:
        self.server = (host, port)
        self.user = user
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="jobguard-pgbouncer-"))
        self.log = self.dir / "pgbouncer.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> PgBouncer:
        (self.dir / "userlist.txt").write_text(f'"{self.user}" ""\n')
        (self.dir / "pgbouncer.ini").write_text(f"""\
[databases]
* = host={self.server[0]} port={self.server[1]}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.dir / "userlist.txt"}
admin_users = {self.user}
pool_mode = transaction
default_pool_size = {POOL_SIZE}
max_client_conn = 200
logfile = {self.log}
""")
        cmd = [shutil.which("pgbouncer") or "pgbouncer", str(self.dir / "pgbouncer.ini")]
        if os.geteuid() == 0:  # "PgBouncer should not run as root"
            shutil.chown(self.dir, "postgres")
            for path in self.dir.iterdir():
                shutil.chown(path, "postgres")
            cmd[1:1] = ["-u", "postgres"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(**self.params(dbname="postgres"), connect_timeout=2) as c:
                    c.execute("SELECT 1")
                return self
            except psycopg.OperationalError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"pgbouncer did not start:\n{self.log_text()}") from None
                time.sleep(0.1)

    def params(self, *, dbname: str) -> dict:
        return {"host": "127.0.0.1", "port": self.port, "user": self.user, "dbname": dbname,
                "autocommit": True}

    def log_text(self, since: int = 0) -> str:
        """The end of the log, from byte ``since`` on (a :meth:`log_size` taken earlier: the
        bouncer serves every test of this process, and an earlier test's lines are not this
        one's)."""
        try:
            with self.log.open("rb") as file:
                file.seek(since)
                return file.read().decode(errors="replace")[-5000:]
        except OSError:
            return "(no log)"

    def log_size(self) -> int:
        try:
            return self.log.stat().st_size
        except OSError:
            return 0

    def admin(self, command: str) -> list[dict[str, str]]:
        """Rows of an admin console command (``SHOW STATS``, ``SHOW POOLS``): the console
        speaks only the simple query protocol, which psql uses."""
        out = subprocess.run(
            ["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, "-d",
             "pgbouncer", "--csv", "-c", command],
            capture_output=True, text=True, timeout=30, check=True).stdout
        return list(csv.DictReader(io.StringIO(out)))

    def transactions(self, database: str) -> int:
        """Transactions PgBouncer has passed on to ``database`` so far."""
        return sum(int(row["total_xact_count"]) for row in self.admin("SHOW STATS")
                   if row["database"] == database)

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            ports = [int(row["local_port"]) for row in self.admin("SHOW SERVERS")]
        except (subprocess.SubprocessError, KeyError, ValueError):
            ports = []
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
        if ports:  # PostgreSQL ends those backends a moment after their socket closes
            host, port = self.server
            with psycopg.connect(host=host, port=port, user=self.user, dbname="postgres",
                                 autocommit=True) as conn:
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline and conn.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE client_port = ANY(%s)",
                        [ports]).fetchone()[0]:
                    time.sleep(0.1)
        shutil.rmtree(self.dir, ignore_errors=True)


def running(*, host: str, port: int, user: str) -> Iterator[PgBouncer]:
    """A started :class:`PgBouncer`, stopped when the generator closes (for fixtures)."""
    bouncer = PgBouncer(host=host, port=port, user=user).start()
    try:
        yield bouncer
    finally:
        bouncer.stop()
