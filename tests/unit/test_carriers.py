"""Context propagation (django_jobguard/carriers.py): what the dispatching code's language,
correlation id, django-tenants schema and user-defined carriers hold is stored in the
payload's ``context`` and restored around the run (sync and async), then taken away."""

from __future__ import annotations

import contextlib
import sys
import types

import pytest
from demo.models import JobRun
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.http import HttpResponse
from django.test import RequestFactory, override_settings
from django.utils import translation

from django_jobguard import carriers
from django_jobguard.conf import jobguard_settings
from django_jobguard.envelope import Envelope
from django_jobguard.exceptions import PayloadError
from django_jobguard.models import QueuedJob
from django_jobguard.testing import drain
from tests.support import work
from tests.support.async_jobs import AsyncContextProbe
from tests.support.jobs import ContextProbe

pytestmark = pytest.mark.django_db


def _seen(label: str) -> str:
    return JobRun.objects.get(label=label).key


def _context() -> dict:
    return QueuedJob.objects.get().payload.get("context", {})


def test_language_and_correlation_id_follow_a_job_and_its_children():
    with carriers.correlation("req-42"), translation.override("fr"):
        ContextProbe("parent", children=1).dispatch()
    assert _context() == {"language": "fr", "correlation_id": "req-42"}
    assert translation.get_language() != "fr" and carriers.correlation_id() is None
    assert work() == ["DONE", "DONE"]
    assert _seen("parent") == "fr|req-42"
    assert _seen("parent+") == "fr|req-42"  # dispatched from inside the run: carried on
    # Restored only around the run: the worker's own context is back.
    assert translation.get_language() != "fr" and carriers.correlation_id() is None


def test_nothing_is_carried_when_there_is_nothing_to_carry():
    ContextProbe("plain").dispatch()
    assert "context" not in QueuedJob.objects.get().payload  # payloads stay as they were
    work()
    assert _seen("plain") == f"{translation.get_language()}|-"


def test_an_async_job_gets_the_context_in_its_own_task():
    with carriers.correlation("req-async"), translation.override("de"):
        AsyncContextProbe("async").dispatch()
    assert drain().states == ["DONE"]  # on a loop of its own in this thread (as tests do)
    assert _seen("async") == "de|req-async"
    assert carriers.correlation_id() is None


class Colour:
    """A user-defined carrier: a context variable of the project's."""

    name = "colour"
    current: list[str] = []

    def capture(self):
        return self.current[-1] if self.current else None

    @contextlib.contextmanager
    def restore(self, value):
        self.current.append(value)
        try:
            yield
        finally:
            self.current.pop()


SEEN: list[str | None] = []


def _user_carriers(*extra: str):
    return override_settings(JOBGUARD={**jobguard_settings.user_settings,
                                       "CONTEXT_CARRIERS": ["django_jobguard.carriers.Language",
                                                            *extra]})


def test_a_user_defined_carrier_is_captured_and_restored(scratch_jobs):
    from django_jobguard import Job

    class ColourProbe(Job):
        def handle(self):
            SEEN.append(Colour().capture())

    SEEN.clear()
    with _user_carriers("tests.unit.test_carriers.Colour"):
        Colour.current.append("teal")
        try:
            ColourProbe().dispatch()
        finally:
            Colour.current.pop()
        assert _context() == {"colour": "teal"}
        work()
    assert SEEN == ["teal"] and Colour.current == []


def test_a_carrier_configured_no_more_leaves_its_entry_alone(scratch_jobs):
    with _user_carriers("tests.unit.test_carriers.Colour"):
        Colour.current.append("teal")
        try:
            ContextProbe("kept").dispatch()
        finally:
            Colour.current.pop()
    assert work() == ["DONE"]  # no carrier named "colour" now: nothing restored, no error
    assert Colour.current == []


@pytest.mark.parametrize(("entry", "message"), [
    ("tests.unit.test_carriers.Nope", "cannot be imported"),
    ("tests.unit.test_carriers.SEEN", "is not a carrier"),
    (42, "is not a dotted path"),
])
def test_a_bad_carrier_entry_says_which_and_why(entry, message):
    with override_settings(JOBGUARD={"CONTEXT_CARRIERS": [entry]}), \
            pytest.raises(ImproperlyConfigured, match=message):
        ContextProbe("x").dispatch()
    assert not QueuedJob.objects.exists()


def test_two_carriers_of_one_name_are_refused():
    with override_settings(JOBGUARD={"CONTEXT_CARRIERS": [
            "django_jobguard.carriers.Language", "django_jobguard.carriers.Language"]}), \
            pytest.raises(ImproperlyConfigured, match="two carriers named 'language'"):
        carriers.carriers()


class Unsafe:
    name = "unsafe"

    def capture(self):
        return object()

    def restore(self, value):
        return contextlib.nullcontext()


def test_a_value_that_is_not_json_safe_fails_the_dispatch_naming_the_carrier():
    with _user_carriers("tests.unit.test_carriers.Unsafe"), \
            pytest.raises(TypeError, match="carrier 'unsafe' captured .* not JSON-safe"):
        ContextProbe("x").dispatch()
    assert not QueuedJob.objects.exists()


def test_a_malformed_context_entry_is_a_payload_error():
    assert Envelope.decode({"args": [], "context": {"language": "fr"}}).context == {
        "language": "fr"}
    assert Envelope(context={"a": 1}).as_json()["context"] == {"a": 1}
    with pytest.raises(PayloadError, match="'context' must be an object"):
        Envelope.decode({"args": [], "context": ["fr"]})


def test_the_django_tenants_schema_is_carried(monkeypatch):
    # A stand-in for django-tenants: its connection's schema_name, and schema_context.
    entered: list[str] = []

    @contextlib.contextmanager
    def schema_context(name):
        entered.append(name)
        yield

    utils = types.ModuleType("django_tenants.utils")
    utils.schema_context = schema_context  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "django_tenants", types.ModuleType("django_tenants"))
    monkeypatch.setitem(sys.modules, "django_tenants.utils", utils)
    monkeypatch.setattr(connection, "schema_name", "acme", raising=False)
    ContextProbe("tenant").dispatch()
    assert _context() == {"tenant": "acme"}
    monkeypatch.delattr(connection, "schema_name")
    assert work() == ["DONE"]
    assert entered == ["acme"]


def test_a_tenant_job_on_a_worker_without_django_tenants_fails_saying_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "django_tenants", None)
    with pytest.raises(ImproperlyConfigured, match="schema 'acme'.*django_tenants cannot"):
        carriers.Tenant().restore("acme")


def test_the_correlation_middleware_takes_the_request_id_or_makes_one():
    seen = []

    def view(request):
        seen.append(carriers.correlation_id())
        return HttpResponse("ok")

    middleware = carriers.CorrelationIdMiddleware(view)
    response = middleware(RequestFactory().get("/", HTTP_X_REQUEST_ID="abc-1"))
    assert seen == ["abc-1"] and response["X-Request-ID"] == "abc-1"
    response = middleware(RequestFactory().get("/"))
    assert len(seen[1]) == 32 and response["X-Request-ID"] == seen[1]
    assert carriers.correlation_id() is None
    with pytest.raises(ValueError, match="non-empty string"):
        carriers.set_correlation_id("")


def test_the_admin_job_details_show_the_context(admin_client):
    from tests.support.jobs import FailMe

    with carriers.correlation("req-<7>"), translation.override("fr"):
        queued = ContextProbe("shown").dispatch()
        FailMe().dispatch()
    body = admin_client.get(f"/admin/django_jobguard/queuedjob/{queued.id}/change/").content
    assert ('<pre class="jobguard-context">correlation_id: req-&lt;7&gt;\nlanguage: fr</pre>'
            in body.decode())
    QueuedJob.objects.filter(id=queued.id).delete()
    work()
    from django_jobguard.models import FailedJob

    failed = FailedJob.objects.get()
    body = admin_client.get(f"/admin/django_jobguard/failedjob/{failed.id}/change/").content
    assert "correlation_id: req-&lt;7&gt;\nlanguage: fr</pre>" in body.decode()
    plain = ContextProbe("plain").dispatch()
    body = admin_client.get(f"/admin/django_jobguard/queuedjob/{plain.id}/change/").content
    assert "jobguard-context" not in body.decode()


def test_chain_links_and_batch_callbacks_carry_the_context_of_their_dispatch():
    from django_jobguard import batch, chain

    with carriers.correlation("req-flow"), translation.override("fr"):
        chain(ContextProbe("link-1"), ContextProbe("link-2")).dispatch()
        batch([ContextProbe("member")]).then(ContextProbe("then")).dispatch()
    # Links after the first and the callbacks are queued by the worker, at an ack outside any
    # job's run: they carry what was captured when the chain and the batch were dispatched.
    assert work() == ["DONE"] * 4
    labels = ("link-1", "link-2", "member", "then")
    assert {label: _seen(label) for label in labels} == dict.fromkeys(labels, "fr|req-flow")
