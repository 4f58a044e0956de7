"""The scrape endpoint: the database gauges of :class:`~.collector.DatabaseCollector`.

Who may read it: a request with ``Authorization: Bearer <JOBGUARD["METRICS_TOKEN"]>`` (what
Prometheus sends with ``authorization: {credentials: …}``), or a logged-in staff user with
the ``django_jobguard.view_queuedjob`` permission (what the admin asks to list jobs).
Anyone else gets 401 with a ``WWW-Authenticate: Bearer`` challenge, or 403 when logged in
without the permission.
"""

from __future__ import annotations

import hmac

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from django_jobguard.conf import jobguard_settings
from django_jobguard.metrics import require

PERMISSION = "django_jobguard.view_queuedjob"


def _has_token(request: HttpRequest) -> bool:
    token = jobguard_settings.METRICS_TOKEN
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return bool(token) and scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode(), str(token).encode())


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """The Prometheus text format of the database gauges (``?database=`` is not taken:
    the queue's database is the default one)."""
    user = getattr(request, "user", None)
    if not _has_token(request):
        if user is None or not user.is_authenticated:
            response = HttpResponse("Authentication required: a staff login or "
                                    "'Authorization: Bearer <JOBGUARD[\"METRICS_TOKEN\"]>'.\n",
                                    status=401, content_type="text/plain")
            response["WWW-Authenticate"] = 'Bearer realm="jobguard metrics"'
            return response
        if not (user.is_staff and user.has_perm(PERMISSION)):
            return HttpResponse(f"Staff status and the {PERMISSION} permission are needed.\n",
                                status=403, content_type="text/plain")
    require()
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    from django_jobguard.metrics.collector import DatabaseCollector

    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
