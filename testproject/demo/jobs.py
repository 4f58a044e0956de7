"""Example jobs from the seed scenarios (used by the demo and the API tests)."""

import time

from django.db.models import F

from django_jobguard import Job, job

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
