"""django.tasks tasks for the demo (only imported when django.tasks or the backport exists)."""

from __future__ import annotations

import inspect
import time

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task

if not any(p.kind is p.VAR_KEYWORD for p in inspect.signature(task).parameters.values()):
    from django_jobguard.tasks_backend import task  # Django 6.0: jobguard's @task takes options


@task(unique_key=lambda product_id, run="": f"{run}:{product_id}", unique_for=60)
def refresh_product_cache(product_id: int, run: str = "") -> dict:
    """Rebuild one product's cache entry; unique per product while queued or running."""
    time.sleep(0.2)
    return {"product_id": product_id, "entries": 42}
