"""Jobs the ``jobguard_demo`` scenarios dispatch. Each records every run as a ``JobRun`` row
(label, key, worker pid, attempt, start and end), which is what the demo reports on.

Every job takes the demo's ``run`` id so that lock keys and limiter keys of one demo run never
meet those of an earlier one.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager

from django.db.models import F
from django.utils import timezone

from django_jobguard import Job, ShouldBeUnique

from .models import JobRun, Profile


@contextmanager
def recorded(job: Job, label: str, key: str = ""):
    """Record one run of ``job``; ``run.key`` may be changed inside (e.g. to an outcome)."""
    run = JobRun.objects.create(label=label, key=key, job_id=job.job_id or "", pid=os.getpid(),
                                attempt=job.attempts(), token=job.lock_token,
                                started_at=timezone.now())
    try:
        yield run
    finally:
        run.ended_at = timezone.now()
        run.save(update_fields=["key", "ended_at"])


class SyncProfileToCrm(ShouldBeUnique, Job):
    """The user clicked "Save": push the profile to the CRM. One sync per profile at a time."""

    unique_for = 60
    tries = 3
    backoff = [1, 5, 10]

    def __init__(self, profile_id: int, run: str = ""):
        self.profile_id, self.run = profile_id, run

    def unique_id(self) -> str:
        return f"{self.run}:{self.profile_id}"

    def handle(self):
        with recorded(self, "crm-sync", str(self.profile_id)):
            time.sleep(0.3)  # the CRM's API is slow
            Profile.objects.filter(pk=self.profile_id).update(syncs=F("syncs") + 1)


class ReindexProducts(ShouldBeUnique, Job):
    """Rebuild the product search index; pointless to queue it twice."""

    unique_for = 120

    def __init__(self, run: str = ""):
        self.run = run

    def unique_id(self) -> str:
        return self.run

    def handle(self):
        with recorded(self, "reindex"):
            time.sleep(0.3)


class DeliverWebhook(Job):
    """Call a partner's webhook; it fails twice, then answers. Retried with backoff."""

    tries = 3
    backoff = [0.5, 1.0]

    def __init__(self, url: str, failures: int = 2):
        self.url, self.failures = url, failures

    def handle(self):
        with recorded(self, "webhook", "ok") as run:
            if self.attempts() <= self.failures:
                run.key = "error"
                raise ConnectionError(f"{self.url} answered 503")


class ChargeExpiredCard(Job):
    """A charge that cannot succeed: after its tries it lands in failed jobs."""

    tries = 2
    backoff = 0.2

    def __init__(self, invoice_number: str):
        self.invoice_number = invoice_number

    def handle(self):
        with recorded(self, "expired-card", "error"):
            raise PermissionError(f"card declined for invoice {self.invoice_number}")


class SendReminder(Job):
    """A reminder dispatched with ``delay=``: no worker takes it before it is due."""

    def __init__(self, user: str):
        self.user = user

    def handle(self):
        with recorded(self, "reminder", self.user):
            pass
