"""The REST API refuses input that nothing reads (issue 18): a typo'd body field or query
parameter is a 400 ``unknown_field`` naming it, never a request that silently does something
else, and the OpenAPI schema says so (``additionalProperties: false``)."""

from __future__ import annotations

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from django_jobguard import get_store
from django_jobguard.api import serializers as s
from django_jobguard.conf import jobguard_settings
from django_jobguard.models import FailedJob, QueuedJob
from tests.support.operate import API, DISPATCHABLE, ENDPOINTS, assert_error, failed_job

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(admin_user) -> APIClient:
    client = APIClient()
    client.force_authenticate(admin_user)
    return client


@pytest.fixture(autouse=True)
def _dispatchable():
    with override_settings(JOBGUARD={**jobguard_settings.user_settings,
                                     "API_DISPATCHABLE_JOBS": DISPATCHABLE}):
        yield


def unknown(response, *names: str) -> dict:
    """The body of a 400 ``unknown_field`` that names exactly ``names``."""
    body = assert_error(response, 400, "unknown_field")
    assert list(body["errors"]) == list(names), body
    for name in names:
        assert repr(name) in body["detail"], body
    return body


def dispatch(api, body) -> object:
    return api.post(API + "dispatch/", body, format="json")


# -- request bodies ------------------------------------------------------------------------


def test_the_issue_example_is_refused_and_queues_nothing(api):
    response = dispatch(api, {"job": "demo.jobs.SyncProfile", "args": [1], "dealy": 60})
    assert response.status_code == 400, response.content  # it was 201, and ran the job now
    assert response.json() == {
        "code": "unknown_field",
        "detail": "unknown field 'dealy' (did you mean 'delay'?)",
        "errors": {"dealy": ["unknown field 'dealy' (did you mean 'delay'?)"]},
    }
    assert not QueuedJob.objects.exists()


def test_several_unknown_fields_are_all_named_in_body_order(api):
    body = unknown(dispatch(api, {"job": "demo.jobs.SyncProfile", "args": [1], "priorty": 5,
                                  "colour": "red", "quue": "high"}),
                   "priorty", "colour", "quue")
    assert body["detail"] == ("unknown field 'priorty' (did you mean 'priority'?); "
                              "unknown field 'colour'; "
                              "unknown field 'quue' (did you mean 'queue'?)")
    assert not QueuedJob.objects.exists()


@pytest.mark.parametrize(("typo", "hint"), [
    ("dely", "delay"), ("arg", "args"), ("kwarg", "kwargs"), ("Priority", "priority"),
])
def test_a_close_typo_gets_a_hint(api, typo, hint):
    body = unknown(dispatch(api, {"job": "demo.jobs.SyncProfile", "args": [1], typo: 1}), typo)
    assert body["detail"] == f"unknown field {typo!r} (did you mean {hint!r}?)"


@pytest.mark.parametrize("far", ["when", "x", "run_at", "delay_seconds_from_now_please"])
def test_a_far_typo_gets_no_hint(api, far):
    body = unknown(dispatch(api, {"job": "demo.jobs.SyncProfile", "args": [1], far: 1}), far)
    assert body["detail"] == f"unknown field {far!r}"


def test_unknown_fields_are_reported_before_other_errors(api):
    # "jb" is why "job" is missing: the hint says so, where "job: required" would not.
    body = unknown(dispatch(api, {"jb": "demo.jobs.SyncProfile", "delay": -1}), "jb")
    assert body["detail"] == "unknown field 'jb' (did you mean 'job'?)"
    # Without unknown fields, the usual field errors come back as before.
    assert "delay" in assert_error(dispatch(api, {"job": "demo.jobs.SyncProfile",
                                                  "delay": -1}), 400, "invalid")["errors"]


@pytest.mark.parametrize("body", ["[1]", "5", '"text"', "null", "true"])
def test_a_body_that_is_not_an_object_is_still_invalid(api, body):
    response = api.post(API + "dispatch/", body, content_type="application/json")
    assert "non_field_errors" in assert_error(response, 400, "invalid")["errors"]


def test_detail_names_at_most_ten_unknown_fields_errors_all_of_them(api):
    fields = {f"zz{i:02}": i for i in range(15)}
    body = assert_error(api.post(API + "failed-jobs/retry-all/", fields, format="json"), 400,
                        "unknown_field")
    assert list(body["errors"]) == list(fields)
    assert body["detail"].count("unknown field") == 10
    assert body["detail"].endswith("unknown field 'zz09'; and 5 more")


def test_unknown_keys_that_utf8_cannot_carry_are_escaped_not_a_500(api):
    response = api.post(API + "failed-jobs/retry-all/", '{"\\ud800": 1, "a\\u0000b": 2}',
                        content_type="application/json")
    body = assert_error(response, 400, "unknown_field")
    assert list(body["errors"]) == ["\\ud800", "a\x00b"]
    assert body["detail"] == r"unknown field '\ud800'; unknown field 'a\x00b'"


def test_retry_all_with_an_unknown_field_retries_nothing(api):
    job = failed_job(queue_name="emails")
    body = unknown(api.post(API + "failed-jobs/retry-all/", {"queu": "emails"}, format="json"),
                   "queu")
    assert body["detail"] == "unknown field 'queu' (did you mean 'queue'?)"
    assert FailedJob.objects.filter(id=job.id).exists() and not QueuedJob.objects.exists()


def test_retry_takes_no_body_but_an_empty_one(api):
    job = failed_job()
    url = f"{API}failed-jobs/{job.id}/retry/"
    body = unknown(api.post(url, {"queue": "other"}, format="json"), "queue")
    assert body["detail"] == "unknown field 'queue' (this request takes no body)"
    assert FailedJob.objects.filter(id=job.id).exists()
    assert_error(api.post(url, [1], format="json"), 400, "invalid")
    assert api.post(url, {}, format="json").json() == {"retried": 1, "ids": [str(job.id)]}
    other = failed_job()
    assert api.post(f"{API}failed-jobs/{other.id}/retry/").status_code == 200  # no body


def test_delete_takes_no_body_so_a_store_sent_there_is_refused(api, store_alias):
    get_store().acquire("jobguard:overlap:k", "o")
    response = api.delete(API + "locks/jobguard:overlap:k/", {"store": store_alias},
                          format="json")
    unknown(response, "store")
    assert get_store().get_lock("jobguard:overlap:k") is not None
    assert api.delete(f"{API}locks/jobguard:overlap:k/?store={store_alias}").status_code == 204


@pytest.mark.parametrize(("method", "path"), [(m, p) for m, p in ENDPOINTS if m != "get"])
def test_every_endpoint_that_changes_something_refuses_an_unknown_body_field(api, method,
                                                                             path):
    response = getattr(api, method)(API + path, {"zzz": 1}, format="json")
    unknown(response, "zzz")


# -- query parameters ----------------------------------------------------------------------


def test_a_query_parameter_typo_does_not_list_everything(api):
    from tests.support.operate import reserved, waiting

    waiting(), reserved()
    body = unknown(api.get(API + "jobs/", {"staet": "reserved"}), "staet")
    assert body["detail"] == "unknown query parameter 'staet' (did you mean 'state'?)"
    assert api.get(API + "jobs/", {"state": "reserved"}).json()["count"] == 1


def test_pagination_and_format_parameters_are_accepted_where_drf_reads_them(api):
    failed_job(), failed_job()
    listed = api.get(API + "failed-jobs/", {"page": 1, "page_size": 1, "format": "json",
                                            "queue": "default"})
    assert listed.status_code == 200 and len(listed.json()["results"]) == 1
    assert api.get(API + "locks/", {"page_size": 5}).status_code == 200
    body = unknown(api.get(API + "failed-jobs/", {"pagesize": 1}), "pagesize")
    assert "did you mean 'page_size'?" in body["detail"]
    # A single lock is not a page: ?page= there is as unknown as any other name.
    unknown(api.get(API + "locks/jobguard:x/", {"page": 2}), "page")


def test_retry_all_refuses_a_queue_sent_as_a_query_parameter(api):
    failed_job(queue_name="emails"), failed_job()
    body = unknown(api.post(API + "failed-jobs/retry-all/?queue=emails"), "queue")
    assert body["detail"] == ("unknown query parameter 'queue' "
                              "(this request takes no query parameters)")
    assert FailedJob.objects.count() == 2 and not QueuedJob.objects.exists()


@pytest.mark.parametrize(("method", "path"), [(m, p) for m, p in ENDPOINTS
                                              if p != "schema/"])
def test_every_endpoint_refuses_an_unknown_query_parameter(api, method, path):
    unknown(getattr(api, method)(API + path + "?zzz=1"), "zzz")


def test_refusals_keep_their_order_auth_then_405_and_404_then_unknown_fields(api):
    assert APIClient().get(API + "jobs/?staet=x").status_code in (401, 403)
    assert_error(api.put(API + "stats/?zzz=1", {"zzz": 1}, format="json"), 405,
                 "method_not_allowed")
    assert_error(api.post(API + "no/such/thing/?zzz=1", {"zzz": 1}, format="json"), 404,
                 "not_found")


# -- the serializers and the schema --------------------------------------------------------


def test_strict_serializer_without_raising_keeps_the_code():
    serializer = s.RetryAllSerializer(data={"queue": "a", "qeue": "b"})
    assert not serializer.is_valid()
    assert serializer.errors["qeue"][0].code == s.UNKNOWN_FIELD
    also = s.StoreQuerySerializer(data={"store": "a", "page": "2"},
                                  context={"also_accepted": ["page"]})
    assert also.is_valid() and dict(also.validated_data) == {"store": "a"}


def test_openapi_request_bodies_are_closed_objects(api):
    schema = api.get(API + "schema/").json()
    components = schema["components"]["schemas"]
    for path, name in [("/jobguard/api/dispatch/", "Dispatch"),
                       ("/jobguard/api/failed-jobs/retry-all/", "RetryAll")]:
        ref = schema["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        assert ref["schema"] == {"$ref": f"#/components/schemas/{name}"}
        assert components[name]["additionalProperties"] is False
    # Responses are not request bodies: the flag is only where input is refused.
    assert "additionalProperties" not in components["QueuedJob"]
    assert "additionalProperties" not in components["Error"]
