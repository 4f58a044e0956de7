"""Context propagation with a real ``jobworker``: a job runs with the language and correlation
id of the code that dispatched it, a job it dispatches carries them on, an async job on the
worker's event loop gets them in its own task, and jobs dispatched without them run without."""

from __future__ import annotations

import pytest
from demo.models import JobRun
from django.utils import translation

from django_jobguard import carriers
from django_jobguard.models import FailedJob, QueuedJob
from tests.support.async_jobs import AsyncContextProbe
from tests.support.jobs import ContextProbe

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_jobs_run_in_the_context_they_were_dispatched_in(workers):
    with carriers.correlation("req-fr"), translation.override("fr"):
        ContextProbe("fr", children=2).dispatch()
        AsyncContextProbe("fr-async").dispatch()
    with carriers.correlation("req-de"), translation.override("de"):
        ContextProbe("de").dispatch()
        AsyncContextProbe("de-async").dispatch()
    ContextProbe("none").dispatch()
    output = "".join(workers(1, "--async-concurrency", "4", "--sleep", "0.05",
                             "--stop-when-empty", "--max-time", "120").wait(120))
    seen = dict(JobRun.objects.values_list("label", "key"))
    default = translation.get_language()
    assert seen == {"fr": "fr|req-fr", "fr+": "fr|req-fr", "fr++": "fr|req-fr",
                    "fr-async": "fr|req-fr", "de": "de|req-de", "de-async": "de|req-de",
                    "none": f"{default}|-"}, output
    assert not QueuedJob.objects.exists() and not FailedJob.objects.exists()
