"""The queue on a database of its own: ``JOBGUARD['DATABASE'] = "queue"`` with
``JobGuardRouter``, and ``default`` a second database holding everything else (users, the
jobs' own models).

On PostgreSQL the two are separate PostgreSQL databases (``<name>`` and ``<name>_queue``, or
``JOBGUARD_TEST_QUEUE_DATABASE_URL``); elsewhere two databases of the same kind (see
tests/settings.py). The tests look at both databases directly (``.using(...)``) to see where
each row went, dispatch in and out of transactions on ``default``, and run a real worker
process that gets the queue's alias only from its settings.
"""

from __future__ import annotations

import pytest
from demo.models import JobRun
from django.contrib.auth import get_user_model
from django.db import connections, transaction
from django.test import override_settings
from rest_framework.test import APIClient

from django_jobguard import dispatch, dispatch_many, get_store, operations
from django_jobguard.conf import jobguard_settings
from django_jobguard.models import FailedJob, Lock, QueuedJob
from django_jobguard.testing import drain
from tests.support import jobs, start_workers, worker_env
from tests.support.lock_jobs import UniqueRecord

pytestmark = pytest.mark.django_db(databases=["default", "queue"], transaction=True)


@pytest.fixture(autouse=True)
def separate():
    """The queue on ``queue``; ``default`` keeps no queue rows."""
    with override_settings(JOBGUARD={**jobguard_settings.user_settings, "DATABASE": "queue",
                                     "STORE": "database"}):
        yield


def on(alias: str):
    return QueuedJob.objects.using(alias)


def test_dispatch_writes_the_queue_database_only():
    sent = dispatch(jobs.Record("a"))
    unique = UniqueRecord("k").dispatch()
    assert sent and unique
    assert {str(i) for i in on("queue").values_list("id", flat=True)} == {sent.id, unique.id}
    assert not on("default").exists()
    assert QueuedJob.objects.count() == 2  # the router reads from "queue"
    # The unique lock is a row of the store's table on the queue's database.
    assert Lock.objects.using("queue").filter(owner=unique.id).exists()
    # (not any lock: on MariaDB other tests' rows may still be there, by the random order)
    assert not Lock.objects.using("default").filter(owner=unique.id).exists()
    assert not UniqueRecord("k").dispatch()  # and it is honoured there


def test_without_on_commit_the_row_commits_on_the_queue_even_if_default_rolls_back():
    """The documented caveat: the caller's transaction on ``default`` does not hold the row."""
    with pytest.raises(RuntimeError), transaction.atomic(using="default"):
        JobRun.objects.create(label="caller", started_at="2026-01-01T00:00Z")
        sent = dispatch(jobs.Record("not-in-the-transaction"))
        raise RuntimeError("the caller's transaction rolls back")
    assert not JobRun.objects.filter(label="caller").exists()
    assert on("queue").filter(id=sent.id).exists()


def test_on_commit_dispatch_follows_the_transaction_on_default():
    with pytest.raises(RuntimeError), transaction.atomic(using="default"):
        dropped = dispatch(jobs.Record("dropped"), on_commit=True)
        dispatch_many([jobs.Record("dropped-too")], on_commit=True)
        raise RuntimeError("rolled back")
    assert not on("queue").exists()

    with transaction.atomic(using="default"):
        kept = dispatch(jobs.Record("kept"), on_commit=True)
        assert not on("queue").exists()  # not before the commit on default
    assert on("queue").filter(id=kept.id).exists()
    assert kept.id != dropped.id


def test_on_commit_may_name_another_alias():
    with transaction.atomic(using="queue"):
        sent = dispatch(jobs.Record("x"), on_commit="queue")
        assert connections["queue"].run_on_commit  # waiting for the queue's commit
        assert not connections["default"].run_on_commit
    assert on("queue").filter(id=sent.id).exists()


@pytest.mark.slow
def test_a_real_worker_runs_the_queue_from_its_settings():
    """No ``--database``: the worker reads JOBGUARD['DATABASE']; the jobs write ``default``."""
    dispatch_many([jobs.Record("w", key=str(n)) for n in range(3)])
    UniqueRecord("u", label="w").dispatch()
    dispatch(jobs.FailMe())
    env = worker_env(JOBGUARD_DATABASE="queue",
                     JOBGUARD_QUEUE_DB_NAME=str(connections["queue"].settings_dict["NAME"]))
    pool = start_workers(1, "--stop-when-empty", "--sleep", "0.1",
                         "--max-time", "120", env=env)
    pool.wait(120)
    assert sorted(JobRun.objects.filter(label="w").values_list("key", flat=True)) == [
        "0", "1", "2", "u"]
    assert not on("queue").exists()
    assert FailedJob.objects.using("queue").count() == 1
    assert not FailedJob.objects.using("default").exists()
    assert get_store().get_lock("jobguard:unique:tests.support.lock_jobs.UniqueRecord:u") is None


def test_admin_and_api_list_and_act_on_the_queue_database(client):
    admin = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    waiting = dispatch(jobs.Record("listed"))
    failed = dispatch(jobs.FailMe())
    drain(delayed=True)  # the in-process worker of the tests, also on "queue"
    assert FailedJob.objects.using("queue").count() == 1

    client.force_login(admin)  # the user and its session live on default
    page = client.get("/admin/django_jobguard/failedjob/")
    assert page.status_code == 200 and failed.id in page.content.decode()

    waiting = dispatch(jobs.Record("listed"))
    page = client.get("/admin/django_jobguard/queuedjob/")
    assert page.status_code == 200 and waiting.id in page.content.decode()

    api = APIClient()
    api.force_authenticate(admin)
    listed = api.get("/jobguard/api/jobs/").json()
    assert [item["id"] for item in listed["results"]] == [waiting.id]
    failed_row = FailedJob.objects.using("queue").get()
    response = api.post(f"/jobguard/api/failed-jobs/{failed_row.id}/retry/")
    assert response.status_code in (200, 201, 202), response.content
    assert not FailedJob.objects.using("queue").exists()
    assert on("queue").count() == 2 and not on("default").exists()
    assert operations.stats()["queues"]["default"]["waiting"] == 2


def test_batches_chains_and_tasks_live_on_the_queue_database():
    from django_jobguard import batch, chain
    from django_jobguard.models import Batch, Chain, JobResult
    from tests.support import tasks

    handle = batch([jobs.Record("b1"), jobs.Record("b2")]).dispatch()
    chain(jobs.Record("c1"), jobs.Record("c2")).dispatch()
    queued = [tasks.add.enqueue(1, 2)] if tasks.task is not None else []
    assert Batch.objects.using("queue").filter(id=handle.id).exists()
    assert Chain.objects.using("queue").count() == 1
    assert not Batch.objects.using("default").exists()
    assert not Chain.objects.using("default").exists()
    assert JobResult.objects.using("queue").count() == len(queued)
    drain()
    assert sorted(JobRun.objects.values_list("label", flat=True)) == ["b1", "b2", "c1", "c2"]
    assert handle.refresh().finished and handle.pending_jobs == 0
    for result in queued:
        result.refresh()
        assert result.return_value == 3
    assert not on("queue").exists() and not JobResult.objects.using("default").exists()
