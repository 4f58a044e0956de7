"""A project whose database never saw ``manage.py migrate`` (issue 30 item 4): ``check
--database`` warns, the worker and ``dispatch()`` say "run manage.py migrate" in one line
instead of a traceback, and all of it goes away once ``migrate`` ran. Run in a throwaway
project with its own SQLite file, in subprocesses, as a new user would."""

from __future__ import annotations

import textwrap

import pytest

from django_jobguard import queue
from tests.support.throwaway import make_project, run_in

JOBS = """
from django_jobguard import Job


class SyncStock(Job):
    def __init__(self, product_id):
        self.product_id = product_id

    def handle(self):
        pass
"""


def test_a_database_without_migrations_says_run_migrate_and_migrate_fixes_it(tmp_path):
    make_project(tmp_path, textwrap.dedent(JOBS))

    check = run_in(tmp_path, "-m", "django", "check", "--database", "default")
    assert check.returncode == 0, check.stderr  # a warning: migrate itself must still run
    assert "jobguard.W020" in check.stderr
    assert "of jobguard's migrations are not applied to database 'default'" in check.stderr
    assert "run `python manage.py migrate`" in check.stderr

    worker = run_in(tmp_path, "-m", "django", "jobworker", "--stop-when-empty")
    assert worker.returncode == 1
    assert "Traceback" not in worker.stderr, worker.stderr
    last = worker.stderr.strip().splitlines()[-1]  # after the settings' own warnings
    assert last.startswith("CommandError: "), last
    assert " of jobguard's migrations are not applied to database 'default'" in last
    assert last.endswith("run `python manage.py migrate`."), last

    dispatch = run_in(tmp_path, "-c", "import django; django.setup(); "
                    "from shop.jobs import SyncStock; SyncStock(1).dispatch()")
    assert dispatch.returncode == 1
    last = dispatch.stderr.strip().splitlines()[-1]
    assert "jobguard's tables are not in database 'default': run `python manage.py migrate`" \
        in last, dispatch.stderr
    assert "The above exception was the direct cause" not in dispatch.stderr

    migrate = run_in(tmp_path, "-m", "django", "migrate")
    assert migrate.returncode == 0, migrate.stderr
    assert "jobguard.W020" not in migrate.stderr  # not while it does what it would ask
    check = run_in(tmp_path, "-m", "django", "check", "--database", "default")
    assert "jobguard.W020" not in check.stderr, check.stderr
    assert run_in(tmp_path, "-c", "import django; django.setup(); "
                "from shop.jobs import SyncStock; SyncStock(1).dispatch()").returncode == 0
    worker = run_in(tmp_path, "-m", "django", "jobworker", "--stop-when-empty")
    assert worker.returncode == 0, worker.stderr


@pytest.mark.django_db
def test_every_shipped_migration_is_applied_to_the_test_database():
    assert queue.unapplied_migrations() == []


def test_only_a_missing_jobguard_table_is_taken_for_migrations_not_run():
    assert queue.not_migrated(Exception('relation "django_jobguard_queuedjob" does not '
                                        'exist\nLINE 1: ...'), "default") == (
        "jobguard's tables are not in database 'default': run `python manage.py migrate` "
        "(the database said: relation \"django_jobguard_queuedjob\" does not exist).")
    assert queue.not_migrated(Exception("no such table: django_jobguard_queuedjob"), "q")
    assert queue.not_migrated(Exception("Table 'x.django_jobguard_queuedjob' doesn't exist"),
                              "q")
    assert queue.not_migrated(Exception('relation "shop_order" does not exist'), "q") == ""
    assert queue.not_migrated(Exception("django_jobguard_queuedjob: deadlock"), "q") == ""


def test_the_message_lists_a_few_migrations():
    assert queue.migrate_message(["0001_a", "0002_b"], "default") == (
        "2 of jobguard's migrations are not applied to database 'default' (0001_a, 0002_b): "
        "run `python manage.py migrate`.")
    assert "(0001_a, 0002_b, ... 0009_i)" in queue.migrate_message(
        ["0001_a", "0002_b", "0003_c", "0009_i"], "default")
