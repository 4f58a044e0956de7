"""Chains: links run in order; a failure stops the chain and cancels the rest; retrying the
failed link resumes it."""

from __future__ import annotations

import pytest
from demo.models import JobRun

from django_jobguard import chain, operations
from django_jobguard.models import Chain, FailedJob, QueuedJob
from tests.support import flow_jobs
from tests.support.flow_jobs import Flaky, Step
from tests.support.inprocess import work

pytestmark = pytest.mark.django_db


def statuses(chain_id: str) -> list[str]:
    return [link["status"] for link in Chain.objects.get(id=chain_id).links]


def test_links_run_in_order_each_queued_after_the_previous():
    handle = chain(Step("a"), Step("b"), Step("c"), name="abc").dispatch()
    assert QueuedJob.objects.count() == 1  # only the first link is queued
    assert str(QueuedJob.objects.get().id) == handle.job_ids[0]
    assert statuses(handle.id) == ["queued", "pending", "pending"]
    assert work() == ["DONE", "DONE", "DONE"]
    runs = list(JobRun.objects.order_by("started_at").values_list("label", "job_id"))
    assert runs == list(zip("abc", handle.job_ids, strict=True))
    row = Chain.objects.get(id=handle.id)
    assert row.status == "completed" and row.finished_at is not None and row.name == "abc"
    assert statuses(handle.id) == ["done", "done", "done"]


def test_a_failure_stops_the_chain_and_retrying_resumes_it():
    flow_jobs.FAILING.add("mid")
    try:
        handle = chain(Step("first"), Flaky("mid"), Step("last-1"), Step("last-2")).dispatch()
        assert work() == ["DONE", "FAILED"]
        assert Chain.objects.get(id=handle.id).status == "failed"
        assert statuses(handle.id) == ["done", "failed", "cancelled", "cancelled"]
        assert not QueuedJob.objects.exists()
        assert str(FailedJob.objects.get().id) == handle.job_ids[1]
    finally:
        flow_jobs.FAILING.discard("mid")
    operations.retry([handle.job_ids[1]])
    assert Chain.objects.get(id=handle.id).status == "running"
    assert statuses(handle.id) == ["done", "queued", "pending", "pending"]
    assert work() == ["DONE", "DONE", "DONE"]
    assert [r for r in JobRun.objects.order_by("started_at").values_list("label", flat=True)] \
        == ["first", "mid", "mid", "last-1", "last-2"]
    assert Chain.objects.get(id=handle.id).status == "completed"


def test_a_bad_link_is_refused_at_dispatch_and_nothing_is_queued():
    with pytest.raises(TypeError, match="args"):
        chain(Step("ok"), Step(object())).dispatch()
    assert not Chain.objects.exists() and not QueuedJob.objects.exists()


def test_an_empty_chain_is_an_error():
    with pytest.raises(ValueError, match="at least one job"):
        chain()


def test_a_chain_dispatched_in_a_rolled_back_transaction_leaves_nothing():
    from django.db import transaction

    with pytest.raises(RuntimeError), transaction.atomic():
        chain(Step("x"), Step("y")).dispatch()
        raise RuntimeError("rollback")
    assert not Chain.objects.exists() and not QueuedJob.objects.exists()


def test_a_deleted_chain_lets_its_queued_link_finish_alone():
    handle = chain(Step("solo"), Step("never")).dispatch()
    Chain.objects.all().delete()
    assert work() == ["DONE"]
    assert list(JobRun.objects.values_list("label", flat=True)) == ["solo"]
    assert handle.id


def test_admin_shows_chains_with_link_statuses(admin_client):
    handle = chain(Step("a"), Step("b"), name="nightly").dispatch()
    work()
    page = admin_client.get("/admin/django_jobguard/chain/")
    assert page.status_code == 200 and "nightly" in page.content.decode()
    assert "2 / 2" in page.content.decode()
    detail = admin_client.get(f"/admin/django_jobguard/chain/{handle.id}/change/").content
    assert handle.job_ids[1].encode() in detail and b"done" in detail


@pytest.mark.parametrize("link", ["not a job", Step, None])
def test_a_link_that_is_not_a_job_instance_is_refused_with_a_clear_message(link):
    with pytest.raises(TypeError, match=r"A chain holds jobs \(Job instances\), not "):
        chain(Step("ok"), link).dispatch()
    assert not Chain.objects.exists() and not QueuedJob.objects.exists()


def test_a_link_of_a_chain_with_unreadable_links_finishes_on_its_own(caplog):
    handle = chain(Step("a"), Step("b")).dispatch()
    Chain.objects.filter(id=handle.id).update(links={"not": "a list"})
    assert work() == ["DONE"]  # acked, not stuck failing its ack; "b" cannot be queued
    assert not QueuedJob.objects.exists() and not FailedJob.objects.exists()
    assert "unreadable links" in caplog.text
