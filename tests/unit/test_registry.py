"""django_jobguard.registry: job names to job classes, and the names operators see.

Covered elsewhere, not repeated here: a second class under a taken name is refused, and an
unknown name's message (tests/unit/test_jobs.py ``test_registry_rejects_a_second_class_with_
the_same_name``, ``test_registry_unknown_name_is_readable``); an unknown job in a row failing
or waiting through the worker (tests/unit/test_pipeline.py, tests/unit/test_worker.py); the
django.tasks adapter's display name of a queued row and of a result
(tests/unit/test_tasks_backend.py, tests/unit/api/test_search_bulk.py).
"""

from __future__ import annotations

import pytest

from django_jobguard import Job, registry
from django_jobguard.registry import UnknownJobError
from tests.support import jobs

pytestmark = pytest.mark.usefixtures("scratch_jobs")


def _job_class(name: str, **attributes) -> type[Job]:
    """A job class that is not registered yet (``abstract`` keeps ``Job`` from doing it)."""
    return type("Scratch", (Job,), {"name": name, "abstract": True, "__module__": __name__,
                                    "handle": lambda self: None, **attributes})


def test_a_registered_class_is_found_by_its_name():
    cls = _job_class("tests.registry.Found")
    with pytest.raises(UnknownJobError):
        registry.get("tests.registry.Found")
    assert registry.register(cls) is cls  # usable as a class decorator
    assert registry.get("tests.registry.Found") is cls
    assert registry.all_jobs()["tests.registry.Found"] is cls


def test_subclassing_job_registers_it_under_module_and_class_name():
    class Subclassed(Job):
        def handle(self):
            return None

    assert Subclassed.name == f"{__name__}.{Subclassed.__qualname__}"
    assert registry.get(Subclassed.name) is Subclassed


def test_registering_the_same_class_again_changes_nothing():
    cls = _job_class("tests.registry.Twice")
    registry.register(cls)
    assert registry.register(cls) is cls
    assert registry.get("tests.registry.Twice") is cls


def test_a_module_imported_again_replaces_its_own_classes():
    """The same module and class name under the same job name (a module re-imported, as
    the autoreloader and ``importlib.reload`` do) takes over the name instead of failing."""
    old, new = _job_class("tests.registry.Reloaded"), _job_class("tests.registry.Reloaded")
    registry.register(old)
    registry.register(new)
    assert registry.get("tests.registry.Reloaded") is new


def test_an_unknown_name_is_a_lookup_error_that_says_where_jobs_register():
    with pytest.raises(LookupError) as caught:
        registry.get("billing.jobs.Renamed")
    assert isinstance(caught.value, UnknownJobError)
    assert "<app>/jobs.py" in str(caught.value)
    assert "JOBGUARD['JOB_MODULES']" in str(caught.value)


def test_an_unknown_name_says_which_registered_job_looks_like_it_and_how_to_keep_old_rows():
    registry.register(_job_class("billing.jobs.SendInvoiceEmail"))
    registry.register(_job_class("billing.tasks.Refund"))
    with pytest.raises(UnknownJobError) as renamed:
        registry.get("billing.jobs.SendInvoiceEmails")   # a rename (close spelling)
    assert "Did you mean 'billing.jobs.SendInvoiceEmail'?" in str(renamed.value)
    assert "name = 'billing.jobs.SendInvoiceEmails'" in str(renamed.value)
    with pytest.raises(UnknownJobError) as moved:
        registry.get("billing.jobs.Refund")               # a move (same class, other module)
    assert "Did you mean 'billing.tasks.Refund'?" in str(moved.value)
    with pytest.raises(UnknownJobError) as unrelated:
        registry.get("shipping.jobs.Label")
    assert "Did you mean" not in str(unrelated.value)


def test_a_signature_problem_names_the_argument_and_what_the_class_takes():
    class Receipt(Job):
        def __init__(self, order: int, *, copies: int = 1):
            self.order = order

        def handle(self):
            return None

    assert registry.signature_problem(Receipt, [1], {"copies": 2}) == ""
    assert registry.signature_problem(Receipt, [1], {"force": True}) == (
        "got an unexpected keyword argument 'force' (this worker's Receipt takes "
        "(order, *, copies=1))")
    assert "missing a required argument: 'order'" in registry.signature_problem(Receipt, [], {})


def test_an_unregistered_name_is_unknown_again():
    cls = _job_class("tests.registry.Gone")
    registry.register(cls)
    registry.unregister("tests.registry.Gone")
    with pytest.raises(UnknownJobError, match="'tests.registry.Gone'"):
        registry.get("tests.registry.Gone")
    registry.unregister("tests.registry.Gone")  # forgetting an unknown name is no error


def test_all_jobs_holds_the_job_modules_and_is_a_copy():
    every = registry.all_jobs()
    assert every[jobs.Noop.name] is jobs.Noop  # from JOBGUARD['JOB_MODULES'] in the tests
    every.clear()
    assert registry.get(jobs.Noop.name) is jobs.Noop


# -- display names -----------------------------------------------------------------------------


@pytest.fixture
def adapter() -> str:
    """An adapter job that runs what its payload names, like the django.tasks one."""
    registry.register(_job_class("tests.registry.Adapter", display_path=("kwargs", "task"),
                                 result_display_path=("task",)))
    return "tests.registry.Adapter"


def test_an_adapter_job_shows_what_it_runs(adapter):
    payload = {"args": [], "kwargs": {"task": "shop.tasks.reindex"}}
    assert registry.display_name(adapter, payload) == "shop.tasks.reindex"
    assert registry.display_name(adapter, {"task": "shop.tasks.reindex"},
                                 result=True) == "shop.tasks.reindex"


@pytest.mark.parametrize("payload", [
    {"args": [], "kwargs": {}},                      # nothing at the path
    {"args": [], "kwargs": {"task": ""}},            # an empty name
    {"args": [], "kwargs": {"task": ["a", "b"]}},    # not a name
    {"args": [], "kwargs": "task"},                  # the path runs into a non-object
    [1, 2],                                          # not an object at all
    None,
])
def test_an_adapter_payload_without_a_usable_name_shows_the_registered_name(adapter, payload):
    assert registry.display_name(adapter, payload) == adapter


def test_other_jobs_and_unknown_names_show_their_own_name():
    payload = {"args": [], "kwargs": {"task": "shop.tasks.reindex"}}
    assert registry.display_name(jobs.Noop.name, payload) == jobs.Noop.name
    assert registry.display_name("gone.Removed", payload) == "gone.Removed"


def test_display_paths_lists_only_adapter_jobs(adapter):
    assert registry.display_paths()[adapter] == ("kwargs", "task")
    assert registry.display_paths(result=True)[adapter] == ("task",)
    assert jobs.Noop.name not in registry.display_paths()
