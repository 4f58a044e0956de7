"""Signals sent along a job's life (``sender`` is the job class; ``job`` the instance), and
a queue's objectives crossed (``sender`` is :class:`~django_jobguard.models.QueueAlert`)."""

from django.dispatch import Signal

#: After a job is queued: ``job``, ``job_id``, ``queue``, ``priority``, and ``delay`` (seconds)
#: or ``at`` (an aware time) when it is delayed.
job_dispatched = Signal()
#: A unique job was not queued because a copy holds its lock: ``job``.
job_skipped_unique = Signal()
#: Rows were inserted (after the job_dispatched signals): ``job_ids``, ``using``. Inline test
#: mode runs them from its receiver, so dispatch() does not depend on the testing package.
jobs_inserted = Signal()
#: A worker is about to run the job: ``job``, ``job_id``.
job_processing = Signal()
#: The job finished (handled, or dropped by middleware): ``job``, ``job_id``, ``result``.
job_processed = Signal()
#: The job went back to the queue: ``job``, ``job_id``, ``delay``, ``reason``, ``exception``.
job_released = Signal()
#: The job failed for good: ``job`` (None if it could not be rebuilt), ``job_id``, ``exception``.
job_failed = Signal()
#: A queue's objective (``JOBGUARD["QUEUES"][queue]["max_wait"]`` or ``["max_failure_rate"]``)
#: was crossed: ``queue``, ``slo`` (the key), ``value`` (seconds or a rate) and ``threshold``.
#: Sent once per crossing across all workers, by the worker whose heartbeat won it
#: (:mod:`django_jobguard.slo`); keep receivers quick, they run in that heartbeat's thread.
queue_slo_breached = Signal()
#: The objective recovered (its value fell to ``SLO_RECOVERY`` x threshold): same arguments.
queue_slo_recovered = Signal()
