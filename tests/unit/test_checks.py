"""System checks: each misconfiguration has an id and a message saying what to change."""

from __future__ import annotations

import pytest
from django.test import override_settings

from django_jobguard.checks import check_settings, check_sqlite_mode


def ids(errors) -> list[str]:
    return [e.id for e in errors]


def test_default_settings_pass():
    assert check_settings() == []


def test_every_check_is_registered_when_the_app_loads():
    """apps.py imports the checks package, which imports each of its modules (settings.py,
    sources.py, databases.py): every check runs in ``manage.py check``."""
    from django.core.checks import Tags, registry

    from django_jobguard import checks

    registered = set(registry.registry.get_checks())
    assert {checks.check_settings, checks.check_schedules, checks.check_overlap_expiry,
            checks.check_sqlite_mode, checks.check_skip_locked} <= registered
    assert Tags.database in checks.check_skip_locked.tags


# Django 6.1 checks a GeneratedField (the queue's debounce_slot) on every alias it may
# migrate to, so a full check run touches the test settings' spare ``queue`` alias too.
@pytest.mark.django_db(databases=["default", "queue"])
def test_manage_py_check_runs_the_settings_checks():
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    with override_settings(JOBGUARD={"RETRY_AFTR": 5}), \
            pytest.raises(SystemCheckError, match=r"jobguard\.E001.*RETRY_AFTR"):
        call_command("check")


def test_not_a_dict():
    with override_settings(JOBGUARD=["nope"]):
        assert ids(check_settings()) == ["jobguard.E001"]


def test_unknown_key():
    with override_settings(JOBGUARD={"RETRY_AFTR": 5}):
        errors = check_settings()
    assert ids(errors) == ["jobguard.E001"] and "RETRY_AFTR" in errors[0].msg
    assert errors[0].msg == "JOBGUARD has an unknown key 'RETRY_AFTR'. Did you mean 'RETRY_AFTER'?"
    with override_settings(JOBGUARD={"store": "redis", "COLOUR": "blue"}):
        errors = check_settings()
    assert [e.msg for e in errors] == [
        "JOBGUARD has an unknown key 'COLOUR'.",                       # nothing looks like it
        "JOBGUARD has an unknown key 'store'. Did you mean 'STORE'?"]  # keys are upper case


def test_wrong_types_and_ranges():
    with override_settings(JOBGUARD={"RETRY_AFTER": "90", "USE_NOTIFY": 1, "CLAIM_BATCH_SIZE": 0}):
        errors = check_settings()
    assert ids(errors) == ["jobguard.E002"] * 3
    assert any("RETRY_AFTER'] must be int or float, not str" in e.msg for e in errors)


def test_async_settings_are_checked():
    cases = (({"ASYNC_CONCURRENCY": 0}, "ASYNC_CONCURRENCY'] must be greater than 0"),
             ({"ASYNC_CONCURRENCY": 2.5}, "ASYNC_CONCURRENCY'] must be int"),
             ({"ASYNC_BLOCKED_AFTER": -1}, "ASYNC_BLOCKED_AFTER'] must not be negative"),
             ({"ASYNC_BLOCKED_AFTER": "1"}, "ASYNC_BLOCKED_AFTER'] must be int or float"))
    for value, message in cases:
        with override_settings(JOBGUARD=value):
            (error,) = check_settings()
        assert error.id == "jobguard.E002" and message in error.msg
    with override_settings(JOBGUARD={"ASYNC_CONCURRENCY": 50, "ASYNC_BLOCKED_AFTER": 0}):
        assert check_settings() == []


def test_max_result_bytes_is_a_non_negative_int():
    cases = (({"MAX_RESULT_BYTES": -1}, "MAX_RESULT_BYTES'] must not be negative"),
             ({"MAX_RESULT_BYTES": "1MB"}, "MAX_RESULT_BYTES'] must be int, not str"),
             ({"MAX_RESULT_BYTES": 1.5}, "MAX_RESULT_BYTES'] must be int, not float"),
             ({"MAX_RESULT_BYTES": True}, "MAX_RESULT_BYTES'] must be int, not bool"))
    for value, message in cases:
        with override_settings(JOBGUARD=value):
            (error,) = check_settings()
        assert error.id == "jobguard.E002" and message in error.msg
    for good in (0, 10_000_000):
        with override_settings(JOBGUARD={"MAX_RESULT_BYTES": good}):
            assert check_settings() == []


def test_failed_retention_is_none_or_positive_days():
    for bad, message in ((0, "must be greater than 0"), ("7", "must be int or float or None")):
        with override_settings(JOBGUARD={"FAILED_RETENTION_DAYS": bad}):
            (error,) = check_settings()
        assert error.id == "jobguard.E002" and message in error.msg
    with override_settings(JOBGUARD={"FAILED_RETENTION_DAYS": 30}):
        assert check_settings() == []


def test_a_lease_shorter_than_the_hard_time_limit_warns():
    with override_settings(JOBGUARD={"RETRY_AFTER": 64, "DEFAULT_TIMEOUT": 60}):
        (warning,) = check_settings()
    assert warning.id == "jobguard.W003" and "ends it at 66 s" in warning.msg
    assert "Raise RETRY_AFTER above 66" in warning.hint
    with override_settings(JOBGUARD={"RETRY_AFTER": 67, "DEFAULT_TIMEOUT": 60}):
        assert check_settings() == []


def test_retry_after_must_exceed_timeouts():
    with override_settings(JOBGUARD={"RETRY_AFTER": 30, "DEFAULT_TIMEOUT": 60}):
        errors = check_settings()
    assert "jobguard.E003" in ids(errors)
    assert "not less than JOBGUARD['RETRY_AFTER']" in errors[0].msg


def test_unknown_store():
    with override_settings(JOBGUARD={"STORE": "memcached"}):
        assert ids(check_settings()) == ["jobguard.E004"]
    with override_settings(JOBGUARD={"STORES": {"x": {"BACKEND": "no.such.Store"}}}):
        assert ids(check_settings()) == ["jobguard.E004"]


def test_redis_store_needs_a_django_redis_cache():
    with override_settings(JOBGUARD={"STORE": "redis"},
                           CACHES={"default": {"BACKEND":
                                   "django.core.cache.backends.locmem.LocMemCache"}}):
        errors = check_settings()
    assert ids(errors) == ["jobguard.E004"] and "not a django-redis cache" in errors[0].msg


def test_redis_store_with_a_cache_alias_not_in_caches_says_the_alias_is_missing():
    with override_settings(JOBGUARD={"STORE": "redis", "STORES": {"redis": {
            "BACKEND": "django_jobguard.stores.redis.RedisStore", "CACHE": "locks"}}},
            CACHES={"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}):
        errors = check_settings()
    assert ids(errors) == ["jobguard.E004"]
    assert errors[0].msg == ("JOBGUARD['STORES']['redis'] uses cache 'locks', which is not in "
                             "CACHES (CACHES has: 'default').")
    assert "pip install" not in errors[0].hint and "Add CACHES['locks']" in errors[0].hint


def test_dispatchable_jobs_must_be_registered():
    with override_settings(JOBGUARD={"API_DISPATCHABLE_JOBS": ["nope.Job"]}):
        errors = check_settings()
    assert ids(errors) == ["jobguard.E005"]
    with override_settings(JOBGUARD={"API_DISPATCHABLE_JOBS": ["tests.support.jobs.Nop"]}):
        errors = check_settings()
    assert "Did you mean 'tests.support.jobs.Noop'?" in errors[0].msg


def test_sqlite_without_immediate_mode_warns():
    from django.db import connections

    conn = connections["default"]
    if conn.vendor != "sqlite":
        pytest.skip("the warning is about SQLite databases")
    options = conn.settings_dict.setdefault("OPTIONS", {})
    saved = options.pop("transaction_mode", None)
    try:
        assert ids(check_sqlite_mode()) == ["jobguard.W001"]
    finally:
        if saved is not None:
            options["transaction_mode"] = saved
    assert check_sqlite_mode() == []


class _OldServer:
    """A connection to a server without SKIP LOCKED, as Django describes one."""

    vendor = "mysql"
    display_name = "MySQL"

    def __init__(self, mariadb: bool, version: tuple[int, ...]) -> None:
        self.mysql_is_mariadb = mariadb
        self.mysql_version = version
        self.features = type("Features", (), {"has_select_for_update_skip_locked": False})()


@pytest.mark.parametrize(("mariadb", "version", "named", "needed"), [
    (True, (10, 5, 8), "MariaDB 10.5.8", "MariaDB >= 10.6"),
    (False, (5, 7, 44), "MySQL 5.7.44", "MySQL >= 8.0.1"),
])
def test_a_queue_database_without_skip_locked_is_an_error_naming_its_version(
        monkeypatch, mariadb, version, named, needed):
    from django.db import connections

    from django_jobguard.checks import check_skip_locked

    monkeypatch.setattr(connections._connections, "default", _OldServer(mariadb, version),
                        raising=False)
    errors = check_skip_locked(databases=["default"])
    assert ids(errors) == ["jobguard.E020"]
    assert named in errors[0].msg and needed in errors[0].msg


def test_jobworker_refuses_a_queue_database_without_skip_locked(monkeypatch):
    from django.core.management import CommandError, call_command
    from django.db import connections

    monkeypatch.setattr(connections._connections, "default", _OldServer(True, (10, 5, 8)),
                        raising=False)
    with pytest.raises(CommandError, match=r"MariaDB 10\.5\.8 .*jobguard\.E020"):
        call_command("jobworker", "--once")


@pytest.mark.django_db
def test_the_test_database_has_skip_locked_or_is_sqlite():
    from django_jobguard.checks import check_skip_locked

    assert check_skip_locked(databases=["default"]) == []
    assert check_skip_locked() == []  # `manage.py check` without --database asks no server
@pytest.mark.parametrize("value", ["10m", -1, True, None, float("nan")])
def test_unknown_job_grace_must_be_seconds(value):
    with override_settings(JOBGUARD={"UNKNOWN_JOB_GRACE": value}):
        errors = check_settings()
    assert ids(errors) == ["jobguard.E040"] and "UNKNOWN_JOB_GRACE" in errors[0].msg


@pytest.mark.parametrize("value", [0, 600, 0.5])
def test_unknown_job_grace_accepts_seconds(value):
    with override_settings(JOBGUARD={"UNKNOWN_JOB_GRACE": value}):
        assert check_settings() == []


# -- PgBouncer and LISTEN_DATABASE (jobguard.E110–E112, W110, W111) --------------------------

_PG = {"ENGINE": "django.db.backends.postgresql", "NAME": "app", "HOST": "127.0.0.1",
       "PORT": "6432", "DISABLE_SERVER_SIDE_CURSORS": True}
_LITE = {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}


@pytest.fixture
def aliases(monkeypatch):
    """Extra DATABASES aliases for the check to read (never connected to)."""
    from django.conf import settings

    def add(**configs):
        for alias, config in configs.items():
            monkeypatch.setitem(settings.DATABASES, alias, config)
    return add


def test_listen_database_must_be_an_alias(aliases):
    with override_settings(JOBGUARD={"LISTEN_DATABASE": "direct"}):
        errors = check_settings()
    assert ids(errors) == ["jobguard.E110"]
    assert "'direct' is not a key of DATABASES" in errors[0].msg


def test_listen_database_must_be_postgresql(aliases):
    aliases(lite=_LITE)
    with override_settings(JOBGUARD={"LISTEN_DATABASE": "lite"}):
        errors = check_settings()
    assert ids(errors) == ["jobguard.E111"]
    assert "'lite' is not a PostgreSQL database (sqlite)" in errors[0].msg


def test_a_postgresql_listen_database_passes(aliases):
    aliases(direct={**_PG, "PORT": "5432"})
    with override_settings(JOBGUARD={"LISTEN_DATABASE": "direct"}):
        assert check_settings() == []


@pytest.mark.parametrize(("declared", "listen", "problem"), [
    (["nope"], None, "names 'nope', which is not a key of DATABASES"),
    (["lite"], None, "names 'lite', which is not a PostgreSQL database"),
    (["pooled"], "pooled", "names 'pooled', the LISTEN_DATABASE"),
])
def test_pgbouncer_must_name_postgresql_aliases_other_than_listen(aliases, declared, listen,
                                                                  problem):
    aliases(lite=_LITE, pooled=_PG)
    with override_settings(JOBGUARD={"PGBOUNCER": declared, "LISTEN_DATABASE": listen}):
        errors = check_settings()
    assert ids(errors) == ["jobguard.E112"] and problem in errors[0].msg


def test_pgbouncer_is_a_bool_or_a_list():
    with override_settings(JOBGUARD={"PGBOUNCER": "default"}):
        assert ids(check_settings()) == ["jobguard.E002"]


def test_pooled_alias_without_disable_server_side_cursors_warns(aliases):
    aliases(pooled={**_PG, "DISABLE_SERVER_SIDE_CURSORS": False})
    with override_settings(JOBGUARD={"PGBOUNCER": ["pooled"]}):
        errors = check_settings()
    assert ids(errors) == ["jobguard.W110"]
    assert "DATABASES['pooled']['DISABLE_SERVER_SIDE_CURSORS'] = True" in errors[0].hint


def test_pooled_alias_with_prepared_statements_warns(aliases):
    aliases(pooled={**_PG, "OPTIONS": {"prepare_threshold": 5}})
    with override_settings(JOBGUARD={"PGBOUNCER": ["pooled"]}):
        errors = check_settings()
    assert ids(errors) == ["jobguard.W111"] and "PgBouncer < 1.21" in errors[0].msg


def test_pgbouncer_true_means_every_postgresql_alias_but_the_listen_database(aliases):
    from django_jobguard import pooling

    aliases(pooled={**_PG, "DISABLE_SERVER_SIDE_CURSORS": False},
            direct={**_PG, "PORT": "5432", "DISABLE_SERVER_SIDE_CURSORS": False}, lite=_LITE)
    with override_settings(JOBGUARD={"PGBOUNCER": True, "LISTEN_DATABASE": "direct"}):
        errors = check_settings()
        pooled = pooling.pooled_aliases()
    assert "pooled" in pooled and "direct" not in pooled and "lite" not in pooled
    assert [e.msg.split("'")[1] for e in errors if e.id == "jobguard.W110"] == [
        alias for alias in pooled if alias in ("default", "queue", "pooled")]


def test_queue_database_must_be_a_known_alias():
    with override_settings(JOBGUARD={"DATABASE": "queues"}):
        (error,) = check_settings()
    assert error.id == "jobguard.E120" and "'queues' is not in DATABASES" in error.msg


def test_a_separate_queue_database_needs_the_router():
    # tests/settings.py defines the "queue" alias and installs JobGuardRouter.
    with override_settings(JOBGUARD={"DATABASE": "queue"}):
        assert check_settings() == []
    with override_settings(JOBGUARD={"DATABASE": "queue"}, DATABASE_ROUTERS=[]):
        (error,) = check_settings()
    assert error.id == "jobguard.E121"
    assert "reads go to 'default', writes go to 'default'" in error.msg
    assert "django_jobguard.routers.JobGuardRouter" in error.hint


def test_a_router_sending_everything_elsewhere_first_is_reported():
    class Everything:
        def db_for_read(self, model, **hints):
            return "default"

        db_for_write = db_for_read

        def allow_migrate(self, db, app_label, **hints):
            return db == "default"

    routers = [Everything(), "django_jobguard.routers.JobGuardRouter"]
    with override_settings(JOBGUARD={"DATABASE": "queue"}, DATABASE_ROUTERS=routers):
        (error,) = check_settings()
    assert error.id == "jobguard.E121" and "migrations are not allowed on 'queue'" in error.msg


def _queues_errors(queues) -> list:
    with override_settings(JOBGUARD={"QUEUES": queues}):
        return check_settings()


def test_queues_must_be_a_dict():
    errors = _queues_errors(["reports"])
    assert ids(errors) == ["jobguard.E002"] and "QUEUES" in errors[0].msg


@pytest.mark.parametrize("queues", [{"reports": 2}, {"": {}}, {"*": {"global_concurrency": 1}}])
def test_queues_must_map_queue_names_to_dicts(queues):
    errors = _queues_errors(queues)
    assert ids(errors) == ["jobguard.E100"] and "queue names to dicts" in errors[0].msg


def test_a_queues_unknown_key_is_named():
    errors = _queues_errors({"reports": {"global_concurency": 2}})
    assert ids(errors) == ["jobguard.E101"] and "'global_concurency'" in errors[0].msg


@pytest.mark.parametrize("cap", [0, -1, 1.5, "2", True, None])
def test_global_concurrency_must_be_a_whole_number_of_jobs(cap):
    errors = _queues_errors({"reports": {"global_concurrency": cap}})
    assert ids(errors) == ["jobguard.E102"] and repr(cap) in errors[0].msg


def test_valid_queues_pass():
    assert _queues_errors({"reports": {"global_concurrency": 2}, "emails": {}}) == []
    assert _queues_errors({"tenants": {"fair": True, "fair_weights": {"big": 3},
                                       "per_key_concurrency": 2}}) == []


@pytest.mark.parametrize("entry,check", [
    ({"fair": "yes"}, "jobguard.E106"),
    ({"fair": 1}, "jobguard.E106"),
    ({"fair_weights": ["big"]}, "jobguard.E107"),
    ({"fair_weights": {"big": 0}}, "jobguard.E107"),
    ({"fair_weights": {"big": 1.5}}, "jobguard.E107"),
    ({"fair_weights": {7: 2}}, "jobguard.E107"),
    ({"per_key_concurrency": 0}, "jobguard.E108"),
    ({"per_key_concurrency": True}, "jobguard.E108"),
    ({"per_key_concurrency": None}, "jobguard.E108"),
])
def test_a_fair_queues_keys_are_checked(entry, check):
    errors = _queues_errors({"tenants": entry})
    assert ids(errors) == [check] and "JOBGUARD['QUEUES']['tenants']" in errors[0].msg
