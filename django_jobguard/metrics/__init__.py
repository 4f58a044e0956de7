"""Prometheus metrics (optional: ``pip install 'django-jobguard[metrics]'``).

Two sources, so that any number of workers on any number of hosts can be scraped without
counting anything twice:

- **the database**, read at scrape time by :class:`~.collector.DatabaseCollector` and served
  by the view in :mod:`.views` (``path("metrics/", include("django_jobguard.metrics.urls"))``
  in a web process): queue depth by state, the oldest waiting job's age, failed jobs, live
  workers, held locks and open circuits. One scrape target says it for the whole system;
- **the worker processes**, which count their own jobs (``jobguard_jobs_total`` and the
  ``jobguard_job_duration_seconds`` histogram, :mod:`.recording`) and serve them on
  ``jobworker --metrics-port`` (:mod:`.server`; one port for all ``--concurrency``
  children, through ``prometheus_client``'s multiprocess mode). Scrape every worker host;
  ``sum by (queue, job, outcome)`` adds them up.

Nothing imports ``prometheus_client`` until metrics are asked for; :func:`require` says
what to install when it is missing.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured


class MetricsUnavailableError(ImproperlyConfigured):
    """``prometheus_client`` is not installed."""


def require() -> None:
    """:class:`MetricsUnavailableError` naming the package to install if it is missing."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise MetricsUnavailableError(
            "Prometheus metrics need the prometheus_client package: "
            "pip install 'django-jobguard[metrics]'.") from None
