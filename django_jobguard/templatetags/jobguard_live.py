"""``{% live_bar "#changelist-form" %}``: the live-update bar of jobguard's admin pages
(``templates/admin/django_jobguard/live.html``, ``static/django_jobguard/live.js``), refreshing
every ``JOBGUARD["ADMIN_REFRESH_SECONDS"]`` seconds; nothing when that is 0."""

from __future__ import annotations

from typing import Any

from django import template

from django_jobguard.conf import jobguard_settings

register = template.Library()


@register.inclusion_tag("admin/django_jobguard/live.html")
def live_bar(targets: str, always: bool = False) -> dict[str, Any]:
    """``targets``: the selectors refreshed, comma separated; ``always``: at every poll, not
    only when the queues' counts changed (the dashboard, whose ages move)."""
    seconds = jobguard_settings.ADMIN_REFRESH_SECONDS
    return {"live_on": bool(seconds), "live_interval": f"{seconds:g}" if seconds else "",
            "live_targets": targets, "live_always": always}
