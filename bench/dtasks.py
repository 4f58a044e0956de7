"""django-tasks' no-op task, run by django-tasks-db's ``db_worker`` (a peer in bench/peers.py),
and its latency stamp (bench/steady.py)."""

try:
    from django.tasks import task  # Django >= 6.0
except ImportError:
    from django_tasks import task  # the backport


@task()
def noop() -> None:
    return None


@task()
def stamp(sent: float) -> None:
    """Records in Redis how long after its dispatch it started (bench/steady.py)."""
    from bench.jobs import record_latency

    record_latency(sent)
