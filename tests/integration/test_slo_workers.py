"""Queue objectives checked by real worker processes at their heartbeats: several workers see
the same crossing, one of them signals it (the webhook gets one POST per crossing)."""

from __future__ import annotations

import datetime
import json
import signal
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from django.utils import timezone

from django_jobguard.models import QueueAlert, QueuedJob, Worker
from tests.support import wait_for, worker_env
from tests.support.operate import waiting

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


class _Hook(BaseHTTPRequestHandler):
    received: list[dict] = []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


def _beats_after(moment: datetime.datetime, workers: int = 3) -> bool:
    """Every worker has beaten twice since ``moment`` (each has checked again)."""
    seen = Worker.objects.filter(last_seen_at__gt=moment + datetime.timedelta(seconds=1.2))
    return seen.count() >= workers


def test_three_workers_signal_one_breach_and_one_recovery(workers):
    _Hook.received = []
    server = HTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = worker_env(JOBGUARD_RETRY_AFTER="1.5", JOBGUARD_DEFAULT_TIMEOUT="1",  # 0.5 s beats
                         JOBGUARD_QUEUES=json.dumps({"unserved": {"max_wait": 5}}),
                         JOBGUARD_SLO_WEBHOOK=f"http://127.0.0.1:{server.server_port}/")
        pool = workers(3, "--queue", "default", "--sleep", "0.1", "--max-time", "120", env=env)
        wait_for(lambda: Worker.objects.count() == 3)
        # A job on a queue no worker serves has waited a minute: every heartbeat sees it.
        row = waiting(queue_name="unserved")
        QueuedJob.objects.filter(pk=row.pk).update(
            available_at=timezone.now() - datetime.timedelta(minutes=1))
        wait_for(lambda: len(_Hook.received) >= 1)
        marked = timezone.now()
        wait_for(lambda: _beats_after(marked))  # every worker has checked it since
        assert [(h["event"], h["queue"], h["slo"]) for h in _Hook.received] == [
            ("breached", "unserved", "max_wait")]
        assert QueueAlert.objects.get(queue="unserved").breached
        QueuedJob.objects.filter(pk=row.pk).delete()
        wait_for(lambda: len(_Hook.received) >= 2)
        marked = timezone.now()
        wait_for(lambda: _beats_after(marked))
        assert [h["event"] for h in _Hook.received] == ["breached", "recovered"]
        assert not QueueAlert.objects.get(queue="unserved").breached
        for proc in pool.procs:
            proc.send_signal(signal.SIGTERM)
        pool.wait(30)
    finally:
        server.shutdown()
        server.server_close()
