"""Example jobs from the seed scenarios (used by the demo and the API tests)."""

import datetime
import time

from django.db.models import F
from django.utils import timezone

from django_jobguard import (
    Job,
    Limit,
    RateLimited,
    ShouldBeUnique,
    ThrottlesExceptions,
    job,
    rate_limiter,
)

from .models import Profile


class SyncProfile(Job):
    """Sync a user's profile with a CRM (the "Save clicked three times" scenario)."""

    queue = "default"
    tries = 3
    backoff = [1, 5, 10]

    def __init__(self, profile_id: int):
        self.profile_id = profile_id

    def handle(self):
        Profile.objects.filter(pk=self.profile_id).update(syncs=F("syncs") + 1)


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
            # TODO(locks): WithoutOverlapping(f"report:{self.account_id}", release_after=5,
            # expire_after=900) goes first here once the locks branch is merged into main.
            ThrottlesExceptions(max_attempts=5, decay_seconds=300, backoff=10,
                                when=RenderingError).by("report-renderer"),
            RateLimited("reports"),
        ]

    def handle(self):
        time.sleep(0.01)  # render
        return f"report-{self.account_id}-{self.kind}.pdf"
