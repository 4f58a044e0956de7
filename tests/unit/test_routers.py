"""JobGuardRouter: the app's models to JOBGUARD['DATABASE'], nothing else there, and nothing
decided while the queue is on ``default``."""

from __future__ import annotations

import pytest
from demo.models import JobRun
from django.contrib.auth.models import User
from django.db import router
from django.test import override_settings

from django_jobguard.models import Batch, FailedJob, Lock, QueuedJob
from django_jobguard.routers import JobGuardRouter

QUEUE_MODELS = [QueuedJob, FailedJob, Lock, Batch]


@pytest.fixture
def separate():
    with override_settings(JOBGUARD={"DATABASE": "queue"}):
        yield


@pytest.mark.usefixtures("separate")
def test_the_apps_models_go_to_the_queue_database_and_nothing_else_does():
    for model in QUEUE_MODELS:
        assert router.db_for_read(model) == router.db_for_write(model) == "queue"
        assert router.allow_migrate_model("queue", model)
        assert not router.allow_migrate_model("default", model)
    for model in (User, JobRun):
        assert router.db_for_read(model) == router.db_for_write(model) == "default"
        assert router.allow_migrate_model("default", model)
        assert not router.allow_migrate_model("queue", model)


@pytest.mark.usefixtures("separate")
def test_relations_stay_inside_one_database():
    routing = JobGuardRouter()
    assert routing.allow_relation(QueuedJob(), FailedJob()) is True
    assert routing.allow_relation(QueuedJob(), User()) is False
    assert routing.allow_relation(User(), JobRun()) is None  # not ours to decide


def test_on_default_it_decides_nothing():
    routing = JobGuardRouter()
    assert routing.db_for_read(QueuedJob) is None and routing.db_for_write(Lock) is None
    assert routing.allow_migrate("default", "django_jobguard") is None
    assert routing.allow_migrate("queue", "auth") is None
    assert routing.allow_relation(QueuedJob(), User()) is None
