"""Tags (issue 31): set at dispatch or on the class, kept on the queued row, the failed job
and the finished run, validated, and filtered on in the admin and the API."""

from __future__ import annotations

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from django_jobguard import Job, job, operations, tags
from django_jobguard.conf import jobguard_settings
from django_jobguard.models import FailedJob, FinishedRun, QueuedJob
from tests.support import jobs
from tests.support.inprocess import make_due, work
from tests.support.operate import API, assert_error

pytestmark = pytest.mark.django_db


class Invoice(Job):
    name = "tests.tags.Invoice"
    tags = ["billing"]

    def __init__(self, invoice_id: int) -> None:
        self.invoice_id = invoice_id

    def handle(self) -> None:
        pass


class Fails(Job):
    name = "tests.tags.Fails"
    tags = ("billing", "fragile")

    def handle(self) -> None:
        raise RuntimeError("no")


@job(tags=["mail"])
def tagged_mail(to: str) -> None:
    pass


def row_tags(job_id) -> list[str]:
    return tags.decode(QueuedJob.objects.get(id=job_id).tags)


# -- validation ----------------------------------------------------------------------------


def test_validate_keeps_order_and_drops_duplicates():
    assert tags.validate(["b", "a", "b"], owner="x") == ("b", "a")
    assert tags.validate(None, owner="x") == ()
    assert tags.encode(("b", "a")) == ",b,a,"
    assert tags.decode(",b,a,") == ["b", "a"]
    assert tags.decode("") == []


@pytest.mark.parametrize(("value", "error", "words"), [
    ("billing", TypeError, "must be a list of strings"),
    ([7], TypeError, "tag 7 is a int"),
    ([""], ValueError, "a tag is empty"),
    (["x" * 51], ValueError, "51 characters long; the most is 50"),
    (["a b"], ValueError, "no spaces or commas"),
    (["a,b"], ValueError, "no spaces or commas"),
    ([f"t{i}" for i in range(11)], ValueError, "11 tags; a job carries at most 10"),
])
def test_validate_names_the_problem(value, error, words):
    with pytest.raises(error, match=words):
        tags.validate(value, owner="tests.Job")


def test_a_class_with_bad_tags_is_refused_when_defined():
    with pytest.raises(ValueError, match=r"tests.tags.Bad.tags: tag 'a b'"):
        class Bad(Job):
            name = "tests.tags.Bad"
            tags = ["a b"]

            def handle(self) -> None:
                pass


def test_a_bad_dispatch_tag_queues_nothing():
    with pytest.raises(ValueError, match="tests.tags.Invoice: tag 'x y'"):
        Invoice(1).dispatch(tags=["x y"])
    with pytest.raises(TypeError, match="must be a list of strings"):
        Invoice(1).dispatch(tags="urgent")
    assert not QueuedJob.objects.exists()


# -- where tags are kept --------------------------------------------------------------------


def test_class_tags_and_dispatch_tags_are_stored_on_the_row():
    assert row_tags(Invoice(1).dispatch().id) == ["billing"]
    assert row_tags(Invoice(2).dispatch(tags=["urgent", "billing"]).id) == ["billing", "urgent"]
    assert row_tags(jobs.Noop(1).dispatch().id) == []
    assert row_tags(jobs.Noop(1).dispatch(tags=["adhoc"]).id) == ["adhoc"]
    assert row_tags(tagged_mail.using(tags=["eu"]).dispatch("a@b.c").id) == ["mail", "eu"]


def test_dispatch_many_tags_every_row():
    from django_jobguard import dispatch_many

    rows = dispatch_many([Invoice(i) for i in range(3)] + [jobs.Noop()], tags=["bulk"])
    assert [row_tags(r.id) for r in rows] == [["billing", "bulk"]] * 3 + [["bulk"]]


def test_an_instance_attribute_named_tags_is_its_own_data():
    class Labelled(Job):
        name = "tests.tags.Labelled"

        def __init__(self, tags: list) -> None:
            self.tags = tags  # an argument, not the job's tags

        def handle(self) -> None:
            pass

    assert row_tags(Labelled(["not", "tags"]).dispatch().id) == []


def test_a_failed_job_and_its_history_keep_the_tags_and_a_retry_puts_them_back():
    with override_settings(JOBGUARD={**jobguard_settings.user_settings, "HISTORY": "all"}):
        failed_id = Fails().dispatch(tags=["nightly"]).id
        done_id = Invoice(5).dispatch(tags=["urgent"]).id
        work()
    failed = FailedJob.objects.get(id=failed_id)
    assert tags.decode(failed.tags) == ["billing", "fragile", "nightly"]
    runs = {str(run.job_id): tags.decode(run.tags) for run in FinishedRun.objects.all()}
    assert runs == {failed_id: ["billing", "fragile", "nightly"], done_id: ["billing", "urgent"]}
    operations.retry([failed_id])
    assert row_tags(failed_id) == ["billing", "fragile", "nightly"]


def test_a_debounced_dispatch_folds_in_its_tags():
    first = Invoice(1).dispatch(debounce=(60, 600), tags=["first"])
    second = Invoice(2).dispatch(debounce=(60, 600), tags=["second"])
    assert second.folded and second.id == first.id
    assert row_tags(first.id) == ["billing", "second"]


# -- filtering ------------------------------------------------------------------------------


def test_the_search_filters_by_whole_tags():
    billing = Invoice(1).dispatch().id
    jobs.Noop().dispatch(tags=["billing-eu"])
    found = operations.JobSearch.from_params({"tag": "billing"}, failed=False).queued_jobs()
    assert [str(i) for i in found.values_list("id", flat=True)] == [billing]
    with pytest.raises(operations.SearchError, match="no spaces or commas") as caught:
        operations.JobSearch.from_params({"tag": "a,b"}, failed=False)
    assert caught.value.param == "tag"


def test_admin_lists_filter_by_tag(admin_client):
    Invoice(1).dispatch(tags=["urgent"])
    jobs.Noop(7).dispatch()
    page = admin_client.get("/admin/django_jobguard/queuedjob/", {"tag": "urgent"})
    assert page.status_code == 200
    assert [row.name for row in page.context["cl"].result_list] == ["tests.tags.Invoice"]
    assert "urgent" in page.content.decode()  # offered as a filter choice
    Fails().dispatch()
    work()
    failed = admin_client.get("/admin/django_jobguard/failedjob/", {"tag": "fragile"})
    assert [row.name for row in failed.context["cl"].result_list] == ["tests.tags.Fails"]
    detail = admin_client.get(f"/admin/django_jobguard/failedjob/"
                              f"{failed.context['cl'].result_list[0].id}/change/")
    assert '<code class="jobguard-tag">fragile</code>' in detail.content.decode()


def test_admin_history_filters_by_tag(admin_client):
    with override_settings(JOBGUARD={**jobguard_settings.user_settings, "HISTORY": "all"}):
        Invoice(1).dispatch(tags=["urgent"])
        jobs.Noop().dispatch()
        work()
    page = admin_client.get("/admin/django_jobguard/finishedrun/", {"tag": "urgent"})
    assert [row.name for row in page.context["cl"].result_list] == ["tests.tags.Invoice"]


def test_api_lists_take_tag_and_show_tags(admin_user):
    client = APIClient()
    client.force_authenticate(admin_user)
    urgent = Invoice(1).dispatch(tags=["urgent"]).id
    jobs.Noop().dispatch()
    body = client.get(API + "jobs/", {"tag": "urgent"}).json()
    assert [(row["id"], row["tags"]) for row in body["results"]] == [
        (urgent, ["billing", "urgent"])]
    assert_error(client.get(API + "jobs/", {"tag": "a b"}), 400)
    with override_settings(JOBGUARD={**jobguard_settings.user_settings, "HISTORY": "all"}):
        Fails().dispatch()
        work()
        make_due()
        work()
    failed = client.get(API + "failed-jobs/", {"tag": "fragile"}).json()["results"]
    assert [row["tags"] for row in failed] == [["billing", "fragile"]]
    runs = client.get(API + "runs/", {"tag": "urgent"}).json()["results"]
    assert [row["job_id"] for row in runs] == [urgent]


def test_api_dispatch_takes_tags(admin_user):
    client = APIClient()
    client.force_authenticate(admin_user)
    with override_settings(JOBGUARD={**jobguard_settings.user_settings,
                                     "API_DISPATCHABLE_JOBS": ["tests.tags.Invoice"]}):
        created = client.post(API + "dispatch/", {"job": "tests.tags.Invoice", "args": [3],
                                                  "tags": ["api"]}, format="json")
        assert created.status_code == 201, created.content
        assert row_tags(created.json()["id"]) == ["billing", "api"]
        bad = client.post(API + "dispatch/", {"job": "tests.tags.Invoice", "args": [3],
                                              "tags": ["a b"]}, format="json")
    assert bad.status_code == 400 and "no spaces or commas" in str(bad.json())


def test_jobs_retry_takes_a_tag():
    from io import StringIO

    from django.core.management import CommandError, call_command

    Fails().dispatch(tags=["nightly"])
    Fails().dispatch()
    work()
    out = StringIO()
    call_command("jobs_retry", "--tag", "nightly", stdout=out)
    assert "1 job(s) queued again." in out.getvalue()
    assert [tags.decode(t) for t in QueuedJob.objects.values_list("tags", flat=True)] == [
        ["billing", "fragile", "nightly"]]
    with pytest.raises(CommandError, match="no spaces or commas"):
        call_command("jobs_retry", "--tag", "a b")
