"""Redis topologies of a test's own: a 3-master Redis Cluster and a Sentinel set (one master,
one replica, one sentinel), each from Debian's ``redis-server`` on free ports with its files in
a temporary directory. Nothing is started globally: the processes belong to the test session
that started them and are stopped (by their process ids) when it ends.

``redis-server --sentinel`` runs a sentinel, so the ``redis-sentinel`` package is not needed.
"""

from __future__ import annotations

import atexit
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from tests.support.pgbouncer import free_port

SERVER = shutil.which("redis-server") or ""
CLI = shutil.which("redis-cli") or ""
MASTER_NAME = "jobguard"
_START_TIMEOUT = 30.0  # seconds a topology may take to come up on a loaded machine


class TopologyError(RuntimeError):
    """A topology did not come up; the message carries the servers' logs."""


class _Servers:
    """redis-server processes of this test session, stopped by their process ids."""

    def __init__(self, prefix: str) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=prefix))
        self.procs: list[subprocess.Popen] = []
        atexit.register(self.stop)  # also when the session ends without its finalizers

    def spawn(self, name: str, args: Sequence[str]) -> None:
        log = self.dir / f"{name}.log"
        self.procs.append(subprocess.Popen(
            [SERVER, *args, "--logfile", str(log)], stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT))

    def logs(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-2000:]}"
                         for log in sorted(self.dir.glob("*.log")))

    def cli(self, port: int, *args: str) -> str:
        done = subprocess.run([CLI, "-h", "127.0.0.1", "-p", str(port), *args],
                              capture_output=True, text=True, timeout=30)
        return done.stdout + done.stderr

    def wait(self, what: str, test, timeout: float = _START_TIMEOUT) -> None:
        """Poll ``test()`` until it is true (the servers' own start-up, not a test's timing)."""
        deadline = time.monotonic() + timeout
        while not test():
            if time.monotonic() > deadline:
                raise TopologyError(f"{what} did not happen in {timeout:g} s\n{self.logs()}")
            for proc in self.procs:
                if proc.poll() is not None:
                    raise TopologyError(f"a redis-server exited ({proc.returncode}) while "
                                        f"waiting for: {what}\n{self.logs()}")
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop this topology's servers (by their process ids) and remove its files; again
        is a no-op."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith((b"+PONG", b"-LOADING"))
    except OSError:
        return False


_COMMON = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--protected-mode", "no"]


class Cluster(_Servers):
    """Three cluster masters, no replicas (``redis-cli --cluster create``)."""

    def __init__(self) -> None:
        super().__init__("jobguard-cluster-")
        self.ports = [free_port() for _ in range(3)]
        self.bus_ports = [free_port() for _ in range(3)]  # else port + 10000 (may be taken)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.ports[0]}"

    def start(self) -> Cluster:
        try:
            for port, bus in zip(self.ports, self.bus_ports, strict=True):
                node = self.dir / str(port)
                node.mkdir()
                self.spawn(f"node-{port}", [
                    "--port", str(port), "--cluster-port", str(bus), "--dir", str(node),
                    *_COMMON,
                    "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", "2000"])
            self.wait("cluster nodes answer", lambda: all(_answers(p) for p in self.ports))
            out = self.cli(self.ports[0], "--cluster", "create",
                           *(f"127.0.0.1:{p}" for p in self.ports),
                           "--cluster-replicas", "0", "--cluster-yes")
            if "[OK] All 16384 slots covered" not in out:
                raise TopologyError(f"redis-cli --cluster create failed:\n{out}\n{self.logs()}")
            self.wait("cluster_state:ok on every node", lambda: all(
                "cluster_state:ok" in self.cli(p, "cluster", "info") for p in self.ports))
        except BaseException:
            self.stop()
            raise
        return self


class Sentinel(_Servers):
    """A master, a replica of it and one sentinel watching it as :data:`MASTER_NAME`."""

    def __init__(self) -> None:
        super().__init__("jobguard-sentinel-")
        self.master_port, self.replica_port, self.sentinel_port = (free_port() for _ in range(3))

    @property
    def sentinels(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", self.sentinel_port)]

    def start(self) -> Sentinel:
        try:
            # No 5 s wait before a diskless full sync (the default delay): either server may
            # be the master after a failover, so both start without it.
            fast_sync = ["--repl-diskless-sync-delay", "0"]
            self.spawn("master", ["--port", str(self.master_port), "--dir", str(self.dir),
                                  *_COMMON, *fast_sync])
            self.spawn("replica", ["--port", str(self.replica_port), "--dir", str(self.dir),
                                   *_COMMON, *fast_sync, "--replicaof", "127.0.0.1",
                                   str(self.master_port)])
            self.wait("master and replica answer",
                      lambda: _answers(self.master_port) and _answers(self.replica_port))
            self.wait("the replica is in sync", lambda: "master_link_status:up" in self.cli(
                self.replica_port, "info", "replication"))
            conf = self.dir / "sentinel.conf"
            conf.write_text(
                f"port {self.sentinel_port}\nbind 127.0.0.1\nprotected-mode no\n"
                f"dir {self.dir}\n"
                f"sentinel monitor {MASTER_NAME} 127.0.0.1 {self.master_port} 1\n"
                f"sentinel down-after-milliseconds {MASTER_NAME} 2000\n"
                f"sentinel failover-timeout {MASTER_NAME} 10000\n")
            self.spawn("sentinel", [str(conf), "--sentinel"])
            self.wait("the sentinel can promote the replica", self._replica_ready)
        except BaseException:
            self.stop()
            raise
        return self

    def _replica_ready(self) -> bool:
        """The sentinel has the replica's own INFO: connected, link to the master up."""
        fields = self.cli(self.sentinel_port, "sentinel", "replicas", MASTER_NAME).split("\n")
        info = dict(zip(fields[::2], fields[1::2], strict=False))
        return (info.get("flags") == "slave" and info.get("master-link-status") == "ok"
                and info.get("info-refresh", "99999").isdigit()
                and int(info.get("info-refresh", "99999")) < 5000)

    def _master_fields(self) -> dict[str, str]:
        fields = self.cli(self.sentinel_port, "sentinel", "master", MASTER_NAME).split("\n")
        return dict(zip(fields[::2], fields[1::2], strict=False))

    def master(self) -> int:
        """The port of the master the sentinel names now."""
        out = self.cli(self.sentinel_port, "sentinel", "get-master-addr-by-name", MASTER_NAME)
        return int(out.split()[1])

    def failover(self) -> int:
        """Promote the replica (``SENTINEL FAILOVER``) and wait until the sentinel names it
        and it accepts writes; returns the new master's port."""
        old = self.master()
        new = self.replica_port if old == self.master_port else self.master_port
        out = self.cli(self.sentinel_port, "sentinel", "failover", MASTER_NAME)
        if "OK" not in out:
            raise TopologyError(f"SENTINEL FAILOVER answered {out!r}")
        self.wait("the sentinel names the new master", lambda: self.master() == new)
        # Clients (redis-py) read SENTINEL MASTERS, which names the old master until the
        # failover has ended.
        self.wait("the failover ends", lambda: self._master_fields().get("flags") == "master"
                  and self._master_fields().get("port") == str(new))
        self.wait("the new master is a master",
                  lambda: "role:master" in self.cli(new, "info", "replication"))
        return new


requires_redis_server = __import__("pytest").mark.skipif(
    not (SERVER and CLI), reason="needs Debian's redis-server and redis-cli")


def sentinel_cache(sentinel: Sentinel) -> dict:
    """A django-redis ``CACHES`` entry for the master behind ``sentinel`` (docs/scale-out.md)."""
    return {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": f"redis://{MASTER_NAME}/0",
        "OPTIONS": {
            "CLIENT_CLASS": "django_redis.client.SentinelClient",
            "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
            "SENTINELS": sentinel.sentinels,
            # Fail fast while no master answers (a failover), instead of a long default wait.
            "SOCKET_CONNECT_TIMEOUT": 2,
            "SOCKET_TIMEOUT": 5,
        },
    }


def topology_stores(cluster: Cluster | None, sentinel: Sentinel | None) -> tuple[dict, dict]:
    """``(JOBGUARD['STORES'] entries, CACHES entries)`` for the stores ``redis-cluster`` and
    ``redis-sentinel`` on the given topologies."""
    stores, caches = {}, {}
    if cluster is not None:
        stores["redis-cluster"] = {"BACKEND": "django_jobguard.stores.redis.RedisStore",
                                   "CLUSTER": cluster.url}
    if sentinel is not None:
        stores["redis-sentinel"] = {"BACKEND": "django_jobguard.stores.redis.RedisStore",
                                    "CACHE": "jobguard-sentinel"}
        caches["jobguard-sentinel"] = sentinel_cache(sentinel)
    return stores, caches
