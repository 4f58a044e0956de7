"""django-tasks' no-op task, run by django-tasks-db's ``db_worker`` (a peer in bench/peers.py)."""

try:
    from django.tasks import task  # Django >= 6.0
except ImportError:
    from django_tasks import task  # the backport


@task()
def noop() -> None:
    return None
