"""Searching queued and failed jobs: names (django.tasks names too), queues, states,
exception classes and JSON lookups inside the arguments, on every database."""

from __future__ import annotations

import pytest

from django_jobguard import operations
from django_jobguard.models import FailedJob, QueuedJob
from django_jobguard.operations import JobSearch, SearchError
from tests.support.operate import failed_job, waiting

pytestmark = pytest.mark.django_db


def ids(rows) -> set[str]:
    return {str(i) for i in rows.values_list("id", flat=True)}


def queued(*args, name="tests.support.jobs.Noop", queue_name="default", **kwargs):
    return QueuedJob.objects.create(name=name, queue=queue_name,
                                    payload={"args": list(args), "kwargs": kwargs})


def search(**params) -> set[str]:
    return ids(JobSearch.from_params(params, failed=False).queued_jobs())


def test_argument_lookups_compare_json_values():
    a = queued(42, "x", invoice_id=7, customer={"email": "a@example.com", "vip": True})
    b = queued("42", None, invoice_id="7", customer={"email": "b@example.com", "vip": False})
    c = queued(43, invoice_id=7.5, note=None)
    assert search(args__0="42") == {str(a.id)}
    assert search(args__0='"42"') == {str(b.id)}
    assert search(args__1="null") == {str(b.id)}
    assert search(kwargs__invoice_id="7") == {str(a.id)}
    assert search(kwargs__invoice_id='"7"') == {str(b.id)}
    assert search(kwargs__invoice_id="7.5") == {str(c.id)}
    assert search(kwargs__customer__email='"b@example.com"') == {str(b.id)}
    assert search(kwargs__customer__vip="true") == {str(a.id)}
    assert search(kwargs__customer__vip="false") == {str(b.id)}
    assert search(args__0="42", kwargs__invoice_id="7") == {str(a.id)}
    assert search(args__0="42", kwargs__invoice_id='"7"') == set()
    assert search(kwargs__missing="1") == set()


def test_a_key_named_like_a_django_lookup_is_a_key():
    row = queued(contains=1, exact="x")
    queued(other=1)
    assert search(kwargs__contains="1") == {str(row.id)}
    assert search(kwargs__exact='"x"') == {str(row.id)}


@pytest.mark.parametrize(("name", "raw", "says"), [
    ("kwargs__id", "abc", "is not valid JSON"),
    ("kwargs__id", "", "is not valid JSON"),
    ("kwargs__id", "{\"a\": 1}", "compare one value"),
    ("kwargs__id", "[1]", "compare one value"),
    ("kwargs__id", "NaN", "not a finite number"),
    ("args__first", "1", "numbered from 0"),
    ("kwargs____id", "1", "empty or blank key"),
    ("kwargs__id", '"a\\u0000b"', "NUL characters"),
    ("kwargs__id", '"\\ud800"', "invalid Unicode"),
    ("kwargs__i\x00d", "1", "NUL characters"),
])
def test_bad_argument_lookups_name_the_parameter(name, raw, says):
    with pytest.raises(SearchError) as caught:
        JobSearch.from_params({name: raw}, failed=False)
    assert caught.value.param == name
    assert says in str(caught.value)


def test_unknown_queue_and_state_are_errors_but_known_queues_are_not():
    waiting(queue_name="emails")
    with pytest.raises(SearchError, match="Unknown queue 'emials'") as caught:
        JobSearch.from_params({"queue": "emials"}, failed=False)
    assert caught.value.param == "queue"
    with pytest.raises(SearchError) as caught:
        JobSearch.from_params({"state": "running"}, failed=False)
    assert caught.value.param == "state"
    assert JobSearch.from_params({"queue": "emails"}, failed=False).queue == "emails"


def test_failed_jobs_by_exception_class_name_or_path():
    timeout = failed_job()
    FailedJob.objects.filter(id=timeout.id).update(exception_class="builtins.TimeoutError")
    other = failed_job()
    FailedJob.objects.filter(id=other.id).update(exception_class="myapp.errors.TimeoutErrorX")
    for value in ("TimeoutError", "builtins.TimeoutError"):
        found = JobSearch.from_params({"exception": value}, failed=True).failed_jobs()
        assert ids(found) == {str(timeout.id)}


def test_name_matches_a_django_task_by_its_own_dotted_name():
    pytest.importorskip("django_jobguard.tasks_backend")
    task_row = QueuedJob.objects.create(
        name="django_jobguard.task", queue="default",
        payload={"args": [], "kwargs": {"task": "tests.support.tasks.add", "backend": "default",
                                        "args": [1, 2], "kwargs": {}}})
    plain = waiting(name="tests.support.jobs.Noop")
    assert search(name="tests.support.tasks.add") == {str(task_row.id)}
    assert search(name="tests.support.jobs.Noop") == {str(plain.id)}
    # the task's own arguments are under kwargs
    assert search(kwargs__args__1="2") == {str(task_row.id)}


def test_describe_says_what_is_searched():
    found = JobSearch.from_params({"name": "x", "kwargs__id": "7", "args__0": '"a"'},
                                  failed=False)
    assert found.describe() == "name 'x', kwargs__id = 7, args__0 = \"a\""
    assert not JobSearch() and JobSearch(name="x")
    assert operations.JobSearch is JobSearch
