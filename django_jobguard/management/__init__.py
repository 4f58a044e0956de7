"""jobguard's management commands (``commands/``) and what they share."""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.core.management.base import BaseCommand


class ReadOnlyCommand(BaseCommand):
    """A command that only reads (``jobs_failed``, ``jobs_monitor``): the system checks run,
    but their errors are shown on stderr instead of stopping it, so that a settings mistake
    elsewhere does not keep an operator from looking at the queue."""

    def check(self, *args: Any, **kwargs: Any) -> None:
        """The system checks, shown but never failing the command."""
        kwargs["fail_level"] = checks.CRITICAL + 1
        super().check(*args, **kwargs)
