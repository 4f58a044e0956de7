"""The Django admin for jobguard: queued and failed jobs, locks, throttles and workers.

One module per area, each registering its model admins when imported (Django's autodiscover
imports this package): ``dashboard`` (the dashboard page, first in the section), ``jobs``
(queued jobs and kept results), ``failed`` (failed jobs), ``workers``, ``queues`` (paused
queues), ``schedules`` (periodic ticks), ``workflows`` (chains and batches) and ``locks``
(locks and throttles, views over the store), ``history`` (finished runs); ``base`` has what
they share.
"""

from __future__ import annotations

from django_jobguard.admin.base import JobNameFilter, JobSearchAdminMixin, ReadOnlyDetailMixin
from django_jobguard.admin.dashboard import DashboardAdmin
from django_jobguard.admin.failed import ExceptionFilter, FailedJobAdmin
from django_jobguard.admin.history import FinishedRunAdmin
from django_jobguard.admin.jobs import JobResultAdmin, QueuedJobAdmin, ResultNameFilter, StateFilter
from django_jobguard.admin.locks import LockAdmin, StoreViewAdmin, ThrottleAdmin
from django_jobguard.admin.queues import PausedQueueAdmin, PauseQueueForm
from django_jobguard.admin.schedules import ScheduleTickAdmin
from django_jobguard.admin.workers import WorkerAdmin, WorkerAliveFilter
from django_jobguard.admin.workflows import BatchAdmin, ChainAdmin

__all__ = [
    "BatchAdmin", "ChainAdmin", "DashboardAdmin", "ExceptionFilter", "FailedJobAdmin",
    "FinishedRunAdmin", "JobNameFilter", "JobResultAdmin", "JobSearchAdminMixin", "LockAdmin",
    "PauseQueueForm", "PausedQueueAdmin", "QueuedJobAdmin", "ReadOnlyDetailMixin",
    "ResultNameFilter",
    "ScheduleTickAdmin", "StateFilter", "StoreViewAdmin", "ThrottleAdmin", "WorkerAdmin",
    "WorkerAliveFilter",
]
