"""Example jobs from the seed scenarios (used by the demo, the API tests and the lock tests).

- "The user clicks Save three times → one sync job": :class:`SyncProfile` is a unique job,
  so the second and third dispatch while the first is queued are dropped.
- "A payment webhook and a Pay click arrive for one invoice → they never overlap":
  :class:`ChargeInvoice` and :class:`RefundInvoice` share the overlap key ``invoice:<id>``,
  so one waits (deferred, no attempt used) while the other runs.
- Rate limits and exception throttling: see docs/limits.md.
- "Export 100,000 invoices across deploys": :class:`ExportInvoices`, an iterable job that
  resumes after the last invoice it committed (docs/long-jobs.md).
"""

import datetime
import time

from django.db.models import F
from django.utils import timezone

from django_jobguard import (
    IterableJob,
    Job,
    Limit,
    RateLimited,
    ShouldBeUnique,
    ThrottlesExceptions,
    WithoutOverlapping,
    job,
    rate_limiter,
)
from django_jobguard.iterable import after

from .models import Invoice, InvoiceExportLine, Profile


class SyncProfile(ShouldBeUnique, Job):
    """Sync a user's profile with a CRM (the "Save clicked three times" scenario).

    Unique per profile: ``SyncProfile(7).dispatch()`` three times in a row queues one job;
    the other two return a falsy handle (``skipped="unique"``). The lock is freed when the sync
    succeeds or fails for good, so a Save after the sync queues a new one. ``unique_for``
    bounds the lock if a worker is killed mid-sync.
    """

    queue = "default"
    tries = 3
    backoff = [1, 5, 10]
    unique_for = 600

    def __init__(self, profile_id: int):
        self.profile_id = profile_id

    def unique_id(self) -> str:
        return str(self.profile_id)

    def handle(self):
        Profile.objects.filter(pk=self.profile_id).update(syncs=F("syncs") + 1)


class _InvoiceJob(Job):
    """Shared by charge and refund: a read-modify-write of the invoice that would lose an
    update if two ran at once (both read, both write the whole row)."""

    abstract = True
    tries = 3

    def __init__(self, invoice_id: int, gateway_seconds: float = 0.2):
        self.invoice_id = invoice_id
        self.gateway_seconds = gateway_seconds

    def middleware(self):
        # shared=True: one key for charge AND refund. A held lock defers the job by 1 s
        # without using a try. renew=True extends the lock every 10 s while the job runs, so
        # a slow gateway never loses it, and a killed worker's lock frees within 30 s.
        return [WithoutOverlapping(f"invoice:{self.invoice_id}", shared=True,
                                   release_after=1, expire_after=30, renew=True)]

    def change(self, invoice: Invoice) -> None:
        raise NotImplementedError

    def handle(self):
        invoice = Invoice.objects.get(pk=self.invoice_id)
        time.sleep(self.gateway_seconds)  # the payment gateway's round trip
        self.change(invoice)
        invoice.save()  # writes every column: an overlapping job's change would be lost


class ChargeInvoice(_InvoiceJob):
    """The Pay click: charge the invoice. Never runs beside a refund of the same invoice."""

    def change(self, invoice: Invoice) -> None:
        invoice.charged += 1


class RefundInvoice(_InvoiceJob):
    """The payment provider's webhook: refund the invoice. Never overlaps a charge of it."""

    def change(self, invoice: Invoice) -> None:
        invoice.refunded += 1


@job(queue="emails", tries=2)
def send_welcome_email(user_email: str) -> str:
    time.sleep(0.001)
    return f"sent to {user_email}"


# -- rate limits and exception throttling (docs/limits.md) ----------------------------------


@rate_limiter("exports")
def exports(job):
    """Free users get 5 PDF exports an hour each; premium users are not limited."""
    if job.plan == "premium":
        return Limit.none()
    return Limit.per_hour(5).by(job.user_id)


class ExportPdf(Job):
    """Render a user's PDF export. Over the limit it waits for a slot (without using a try)."""

    def __init__(self, user_id: int, plan: str = "free"):
        self.user_id, self.plan = user_id, plan

    def middleware(self):
        return [RateLimited("exports")]

    def handle(self):
        return f"export-{self.user_id}.pdf"


class SmsGatewayError(Exception):
    """The SMS provider did not answer (timeout, 5xx)."""


class InvalidNumber(ValueError):
    """The provider rejected the number: retrying cannot help."""


def send_through_gateway(to: str, text: str) -> None:
    """Stand-in for the provider's client: down while a Profile named "sms-gateway-down"
    exists (the demo and the tests switch it)."""
    if not to.startswith("+"):
        raise InvalidNumber(f"{to!r} is not an E.164 number")
    if Profile.objects.filter(name="sms-gateway-down").exists():
        raise SmsGatewayError("SMS gateway: 503 Service Unavailable")


class SendSms(Job):
    """During a provider outage, stop hammering it: after 10 failures in 10 minutes the
    circuit opens for 10 minutes, then a single probe finds out whether it is back."""

    tries = 0  # no fixed number of tries: retry_until ends the retries

    def __init__(self, to: str, text: str):
        self.to, self.text = to, text

    def retry_until(self):
        return timezone.now() + datetime.timedelta(hours=6)

    def middleware(self):
        return [ThrottlesExceptions(max_attempts=10, decay_seconds=600, backoff=30,
                                    when=SmsGatewayError, delete_when=InvalidNumber,
                                    report=True).by("sms-gateway")]

    def handle(self):
        send_through_gateway(self.to, self.text)


class RenderingError(Exception):
    """The report-rendering service failed."""


@rate_limiter("reports")
def reports(job):
    """3 reports a minute per account, and at most 100 an hour for everybody together."""
    return [Limit.per_minute(3).by(job.account_id), Limit.per_hour(100)]


class GenerateReport(ShouldBeUnique, Job):
    """Everything at once, in the documented order: unique per (account, kind) at dispatch;
    then, when it runs: one report per account at a time, the circuit around the renderer,
    and the rate limit last so that only a job that will really run uses a slot."""

    unique_for = 3600
    tries = 0

    def __init__(self, account_id: int, kind: str):
        self.account_id, self.kind = account_id, kind

    def unique_id(self) -> str:
        return f"{self.account_id}:{self.kind}"

    def retry_until(self):
        return timezone.now() + datetime.timedelta(hours=2)

    def middleware(self):
        return [
            WithoutOverlapping(f"report:{self.account_id}", release_after=5, expire_after=900),
            ThrottlesExceptions(max_attempts=5, decay_seconds=300, backoff=10,
                                when=RenderingError).by("report-renderer"),
            RateLimited("reports"),
        ]

    def handle(self):
        time.sleep(0.01)  # render
        return f"report-{self.account_id}-{self.kind}.pdf"


class ExportInvoices(IterableJob):
    """A bulk invoice export that survives deploys (docs/long-jobs.md#iterable-jobs).

    Each invoice's line and the export's checkpoint commit in one transaction, so a SIGTERM,
    a ``--max-time`` or a lost lease stops it between invoices and the next run goes on
    after the last one written: no invoice is exported twice, none is skipped, and the
    interruption uses no attempt. ``max_run_time`` hands it back every 5 minutes, so one
    export never holds a worker for hours."""

    queue = "default"
    tries = 3
    timeout = 0  # the runs are bounded by max_run_time, not by a job timeout
    max_run_time = 300

    def __init__(self, export: str):
        self.export = export

    def items(self, cursor):
        return after(Invoice.objects.all(), cursor)

    def total(self) -> int:
        return Invoice.objects.count()

    def each(self, invoice: Invoice) -> None:
        InvoiceExportLine.objects.create(export=self.export, invoice=invoice,
                                         charged=invoice.charged)

    def finished(self) -> int:
        return InvoiceExportLine.objects.filter(export=self.export).count()
