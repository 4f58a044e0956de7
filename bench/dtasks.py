"""django-tasks' no-op task, run by django-tasks-db's ``db_worker`` (a peer in bench/peers.py)."""

from django_tasks import task


@task()
def noop() -> None:
    return None
