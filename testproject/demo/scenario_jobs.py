"""Jobs the ``jobguard_demo`` scenarios dispatch. Each records every run as a ``JobRun`` row
(label, key, worker pid, attempt, start and end), which is what the demo reports on.

Every job takes the demo's ``run`` id so that lock keys and limiter keys of one demo run never
meet those of an earlier one.
"""

from __future__ import annotations

import datetime
import os
import time
from contextlib import contextmanager

from django.db.models import F
from django.utils import timezone

from django_jobguard import Batchable, Job, ShouldBeUnique

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


# -- overlap locks (WithoutOverlapping) ------------------------------------------------------
# Imported inside middleware() so that this module loads in builds without the feature.


class PullCreditScore(Job):
    """Ask the credit bureau for a user's score; two pulls for one user must never overlap."""

    tries = 3

    def __init__(self, user_id: int, run: str = ""):
        self.user_id, self.run = user_id, run

    def middleware(self):
        from django_jobguard import WithoutOverlapping

        return [WithoutOverlapping(f"{self.run}:{self.user_id}", release_after=0.2,
                                   expire_after=30)]

    def handle(self):
        with recorded(self, "credit-score", str(self.user_id)):
            time.sleep(0.5)


class _InvoicePayment(Job):
    """Charge and refund of one invoice share one overlap key, so they run one after another."""

    abstract = True
    tries = 3
    label = ""

    def __init__(self, invoice_id: int, run: str = ""):
        self.invoice_id, self.run = invoice_id, run

    def middleware(self):
        from django_jobguard import WithoutOverlapping

        return [WithoutOverlapping(f"{self.run}:invoice:{self.invoice_id}", shared=True,
                                   release_after=0.2, expire_after=30)]

    def handle(self):
        with recorded(self, self.label, str(self.invoice_id)):
            time.sleep(0.4)  # the payment gateway's round trip


class CaptureInvoicePayment(_InvoicePayment):
    label = "charge"


class RefundInvoicePayment(_InvoicePayment):
    label = "refund"


# -- rate limits and exception throttling (RateLimited, ThrottlesExceptions) -----------------

try:
    from django_jobguard import Limit, rate_limiter
except ImportError:  # a build without limits
    Limit = rate_limiter = None

if rate_limiter is not None:

    @rate_limiter("demo-pdf-exports")
    def pdf_exports(job):
        """Free users: 5 exports an hour each; premium users: no limit."""
        if job.plan == "premium":
            return Limit.none()
        return Limit.per_hour(5).by(f"{job.run}:{job.user}")

    @rate_limiter("demo-reports")
    def reports(job):
        """At most 3 reports a minute per account."""
        return Limit.per_minute(3).by(f"{job.run}:{job.account}")


class ExportPdf(Job):
    """Render a PDF export; rate limited per user by plan."""

    def __init__(self, user: str, plan: str, n: int, run: str = ""):
        self.user, self.plan, self.n, self.run = user, plan, n, run

    def middleware(self):
        from django_jobguard import RateLimited

        return [RateLimited("demo-pdf-exports")]

    def handle(self):
        with recorded(self, "pdf", f"{self.plan}:{self.user}"):
            pass


class SendSms(Job):
    """Send an SMS through a provider that may be down; a circuit breaker spares it."""

    tries = 0  # unlimited: the deadline below ends the retries

    def __init__(self, to: str, run: str = ""):
        self.to, self.run = to, run

    def retry_until(self):
        return timezone.now() + datetime.timedelta(minutes=2)

    def middleware(self):
        from django_jobguard import ThrottlesExceptions

        return [ThrottlesExceptions(max_attempts=3, decay_seconds=2, backoff=0.1)
                .by(f"{self.run}:sms-provider")]

    def handle(self):
        with recorded(self, "sms", "sent") as run:
            if Profile.objects.filter(name=f"sms-provider-down:{self.run}").exists():
                run.key = "error"
                raise ConnectionError("SMS provider: 503 Service Unavailable")


class GenerateReport(ShouldBeUnique, Job):
    """Everything at once: unique per (account, kind), never two reports of an account at the
    same time, 3 a minute per account, and a circuit around the rendering service."""

    unique_for = 300
    tries = 0

    def __init__(self, account: str, kind: str, run: str = ""):
        self.account, self.kind, self.run = account, kind, run

    def unique_id(self) -> str:
        return f"{self.run}:{self.account}:{self.kind}"

    def retry_until(self):
        return timezone.now() + datetime.timedelta(minutes=5)

    def middleware(self):
        from django_jobguard import RateLimited, ThrottlesExceptions, WithoutOverlapping

        # The documented order (docs/limits.md): lock, then circuit, then rate limit, so that
        # a job deferred by the lock or an open circuit does not use a rate-limit slot.
        return [
            WithoutOverlapping(f"{self.run}:report:{self.account}", release_after=0.2,
                               expire_after=60),
            ThrottlesExceptions(max_attempts=5, decay_seconds=30).by(f"{self.run}:renderer"),
            RateLimited("demo-reports"),
        ]

    def handle(self):
        with recorded(self, "report", f"{self.account}:{self.kind}"):
            time.sleep(0.3)


class ImportChunk(Job):
    """One chunk of an uploaded file; chunk ``bad`` fails (no retries)."""

    tries = 1

    def __init__(self, upload: str, chunk: int, bad: int = -1, *, run: str = ""):
        self.upload, self.chunk, self.bad, self.run = upload, chunk, bad, run

    def handle(self):
        with recorded(self, "import-chunk", key=f"{self.upload}:{self.chunk}"):
            time.sleep(0.05)
        if self.chunk == self.bad:
            raise ValueError(f"chunk {self.chunk} of {self.upload} has a malformed row")


class ImportCallback(Batchable, Job):
    """A batch callback: records which one ran (``then``, ``catch`` or ``finally``)."""

    def __init__(self, upload: str, which: str, *, run: str = ""):
        self.upload, self.which, self.run = upload, which, run

    def handle(self):
        batch = self.batch
        counts = f"{batch.total_jobs}/{batch.pending_jobs}/{batch.failed_jobs}" if batch else ""
        with recorded(self, f"import-{self.which}", key=f"{self.upload}:{counts}"):
            pass


class InvoiceStep(Job):
    """One step of the invoice chain: fetch → render → email."""

    def __init__(self, invoice: int, step: str, *, run: str = ""):
        self.invoice, self.step, self.run = invoice, step, run

    def handle(self):
        with recorded(self, "invoice-step", key=f"{self.invoice}:{self.step}"):
            time.sleep(0.02)
