"""Example jobs from the seed scenarios (used by the demo, the API tests and the lock tests).

- "The user clicks Save three times → one sync job": :class:`SyncProfile` is a unique job,
  so the second and third dispatch while the first is queued are dropped.
- "A payment webhook and a Pay click arrive for one invoice → they never overlap":
  :class:`ChargeInvoice` and :class:`RefundInvoice` share the overlap key ``invoice:<id>``,
  so one waits (deferred, no attempt used) while the other runs.
"""

import time

from django.db.models import F

from django_jobguard import Job, ShouldBeUnique, WithoutOverlapping, job

from .models import Invoice, Profile


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
