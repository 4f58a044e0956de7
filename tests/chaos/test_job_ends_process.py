"""Job code that ends its process under ``--concurrency`` (issue 12 item 1).

Two jobs calling ``sys.exit(0)`` and 20 plain jobs used to end a ``--concurrency 2`` pool
after 2 s with 22 jobs queued and nothing logged. Now ``SystemExit`` / ``KeyboardInterrupt``
from a job are that job's failure, and a child ended by ``os._exit(0)`` is logged and
replaced; every job reaches an outcome.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile

import pytest
from demo.models import JobRun

from django_jobguard import dispatch_many
from django_jobguard.models import FailedJob, QueuedJob
from tests.chaos.conftest import chaos_env
from tests.chaos.jobs import EndsTheProcess
from tests.support import MANAGE, ROOT, jobs, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PLAIN = 20


@pytest.mark.parametrize("enders", [("sys.exit", "sys.exit"), ("os._exit", "KeyboardInterrupt")],
                         ids=["sys-exit", "os-exit-and-keyboard-interrupt"])
def test_jobs_ending_their_process_do_not_stop_the_pool(enders):
    handles = dispatch_many([EndsTheProcess(how) for how in enders]
                            + [jobs.Record("plain", key=str(i)) for i in range(PLAIN)])
    ender_ids = {str(h.id) for h in handles[:len(enders)]}
    log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, str(MANAGE), "jobworker", "--concurrency", "2",
                             "--sleep", "0.2"], env=chaos_env(), cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        # Every job reaches an outcome: the plain ones ran, the others are failed jobs.
        wait_for(lambda: proc.poll() is not None or (
            not QueuedJob.objects.exists()
            and FailedJob.objects.filter(id__in=ender_ids).count() == len(enders)), timeout=90)
        assert proc.poll() is None, "the supervisor exited while jobs were left"
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.seek(0)
        output = log.read()
        log.close()

    assert not QueuedJob.objects.exists(), output[-3000:]
    assert sorted(JobRun.objects.filter(label="plain").values_list("key", flat=True)) == sorted(
        str(i) for i in range(PLAIN))
    failed = {str(f.id): f for f in FailedJob.objects.all()}
    assert set(failed) == ender_ids, output[-3000:]
    for row in failed.values():
        how = row.payload.get("kwargs", {}).get("how") or row.payload["args"][0]
        if how == "sys.exit":
            assert row.exception_class == "builtins.SystemExit"
        elif how == "KeyboardInterrupt":
            assert row.exception_class == "builtins.KeyboardInterrupt"
    if "os._exit" in enders:
        # The child its job ended is logged and replaced.
        assert "without its worker stopping" in output, output[-3000:]
