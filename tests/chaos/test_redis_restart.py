"""Restart Redis (``shutdown nosave``) while workers run unique jobs whose locks live in the
Redis store.

The test starts its OWN redis-server on a free port and restarts only that one, so it never
touches the Redis other test runs use; it still only runs where JOBGUARD_CHAOS_REDIS_RESTART=1
(``.ci/run`` sets it).

While Redis is down a worker that finishes a job cannot release its unique lock: the job is
already acked, so the worker logs it and goes on (the restart without persistence dropped the
lock anyway). Afterwards every job has run, nothing is failed or left queued, and the same
unique keys can be dispatched again.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess

import pytest
from demo.models import JobRun
from django.test import override_settings

from django_jobguard import dispatch_many, stores
from django_jobguard.conf import jobguard_settings
from django_jobguard.models import FailedJob, QueuedJob
from tests.chaos import jobs as chaos_jobs
from tests.chaos.conftest import Outcome, chaos_env
from tests.utils import wait_for

pytestmark = [
    pytest.mark.chaos, pytest.mark.slow, pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(os.environ.get("JOBGUARD_CHAOS_REDIS_RESTART") != "1",
                       reason="restarts a redis-server: set JOBGUARD_CHAOS_REDIS_RESTART=1"),
    pytest.mark.skipif(not shutil.which("redis-server"), reason="needs redis-server"),
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PrivateRedis:
    """A redis-server of this test alone, without persistence."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self.answers, timeout=20)

    def answers(self) -> bool:
        return subprocess.run(["redis-cli", "-p", str(self.port), "ping"], capture_output=True,
                              text=True).stdout.strip() == "PONG"

    def shutdown(self) -> None:
        subprocess.run(["redis-cli", "-p", str(self.port), "shutdown", "nosave"],
                       capture_output=True)
        if self.proc is not None:
            self.proc.wait(timeout=20)


@pytest.fixture
def private_redis():
    server = PrivateRedis()
    server.start()
    caches = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": server.url,
                          "KEY_PREFIX": "jgchaos"}}
    with override_settings(CACHES=caches,
                           JOBGUARD={**jobguard_settings.user_settings, "STORE": "redis"}):
        stores.reset()
        yield server
    stores.reset()
    server.shutdown()


def test_redis_restart_loses_no_job_and_leaves_no_stale_lock(fleet, private_redis):
    total = 300
    handles = dispatch_many([chaos_jobs.UniqueRecord(str(i)) for i in range(total)])
    assert all(handles)
    workers = fleet("--sleep", "0.2", env=chaos_env(JOBGUARD_REDIS_URL=private_redis.url,
                                                    JOBGUARD_STORE="redis"))
    procs = workers.start(2)
    wait_for(lambda: JobRun.objects.filter(label="unique").count() >= total // 4, timeout=60)

    private_redis.shutdown()
    down_at = JobRun.objects.filter(label="unique", ended_at__isnull=False).count()
    # jobs keep finishing while Redis is down (only their lock release fails)
    wait_for(lambda: JobRun.objects.filter(label="unique", ended_at__isnull=False).count()
             >= down_at + 10, timeout=60)
    private_redis.start()

    wait_for(lambda: not QueuedJob.objects.exists(), timeout=120)
    assert all(p.poll() is None for p in procs)  # no worker died
    assert all(code == 0 for code in workers.stop_all())
    assert "Could not release unique lock" in workers.errors()

    out = Outcome.read((h.id for h in handles), "unique")
    assert out.queued == 0 and not FailedJob.objects.exists()
    assert out.completed == out.ids
    # no lock outlived its job: every key can be dispatched again
    again = dispatch_many([chaos_jobs.UniqueRecord(str(i)) for i in range(total)])
    assert all(again)
