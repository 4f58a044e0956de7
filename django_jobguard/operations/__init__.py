"""What operators do: the one layer that the admin, the REST API and the management commands
call, and that the worker's housekeeping runs.

- :mod:`.queued`: cancel (never a reserved job), cancel-or-stop one job, run now, clear,
  requeue an orphaned reservation (owner-checked);
- :mod:`.failed`: retry, forget, flush, prune;
- :mod:`.bulk`: retry, forget or delete every job a search matches, in bounded batches;
- :mod:`.locks`: locks and throttles of any store, with a "stale" verdict; force-release,
  reset, clean;
- :mod:`.pausing`: pause and resume queues;
- :mod:`.search`: the filters of the admin, the API and the commands (name, queue, state,
  exception class, JSON lookups inside the arguments);
- :mod:`.monitoring`: stats, the monitor's thresholds and the dashboard's overview;
- :mod:`.workers`: which workers are alive; quiet or stop one (through its row);
- :mod:`.maintenance`: housekeeping (what every worker does once a minute); pruning results.

Job states are defined once, on the model (:class:`~django_jobguard.models.QueuedJobQuerySet`,
database clock); :data:`STATES` is their names.

Audit log (:mod:`.audit`): every destructive action that changes something is logged once, at
WARNING on the ``django_jobguard.operations`` logger, with what was done, how many and by whom
(``actor``: the user's name from the admin and the API, ``manage.py <command>`` from a
command).

Call these through this package (``operations.retry(...)``), not their modules.
"""

from django_jobguard.models import STATES
from django_jobguard.operations.bulk import (
    BulkResult,
    delete_matching,
    forget_matching,
    retry_matching,
)
from django_jobguard.operations.failed import (
    FailedJobNotFound,
    FailedSelection,
    failed_before,
    flush,
    forget,
    parse_ids,
    prune_failed,
    retry,
)
from django_jobguard.operations.locks import (
    LOCK_KINDS,
    LockRow,
    LockRowPage,
    ThrottleRow,
    UnknownStoreError,
    clean_locks,
    force_release,
    inspect_lock,
    inspect_locks,
    inspect_throttles,
    lock_page,
    reset_throttle,
    store_for,
    usable_stores,
)
from django_jobguard.operations.maintenance import (
    Housekeeping,
    housekeeping,
    prune_results,
    result_retention,
)
from django_jobguard.operations.monitoring import (
    MonitorReport,
    QueueHealth,
    monitor,
    overview,
    queue_stats,
    stats,
)
from django_jobguard.operations.pausing import (
    QueueNameError,
    check_queue_name,
    is_known_queue,
    pause,
    paused_queues,
    resume,
)
from django_jobguard.operations.queued import (
    DELETED,
    NOT_RESERVED,
    STOPPING,
    WORKER_ALIVE,
    CancelResult,
    ClearResult,
    JobNotQueuedError,
    RequeueRefused,
    RequeueResult,
    cancel,
    cancel_job,
    clear,
    requeue,
    requeue_job,
    run_now,
)
from django_jobguard.operations.search import (
    JobSearch,
    SearchError,
    name_q,
    result_name_q,
)
from django_jobguard.operations.workers import (
    DEAD_WORKER_AFTER_LEASES,
    WorkerGoneError,
    WorkerNotFound,
    command_worker,
    live_workers,
    running_jobs,
    stale_reservations,
    worker_states,
)

__all__ = [
    "DEAD_WORKER_AFTER_LEASES", "DELETED", "STATES", "STOPPING", "CancelResult", "ClearResult",
    "BulkResult", "NOT_RESERVED", "RequeueRefused", "RequeueResult", "WORKER_ALIVE",
    "delete_matching", "forget_matching", "requeue", "requeue_job", "retry_matching",
    "stale_reservations", "worker_states", "command_worker", "WorkerGoneError", "WorkerNotFound",
    "running_jobs",
    "FailedJobNotFound", "FailedSelection", "JobSearch", "failed_before", "SearchError", "name_q",
    "result_name_q", "Housekeeping", "JobNotQueuedError", "LOCK_KINDS",
    "LockRow", "LockRowPage", "inspect_lock", "lock_page",
    "MonitorReport", "QueueHealth", "QueueNameError", "ThrottleRow", "UnknownStoreError",
    "cancel", "cancel_job", "check_queue_name", "clean_locks", "clear", "flush",
    "force_release", "forget", "housekeeping", "inspect_locks", "inspect_throttles",
    "is_known_queue", "live_workers", "monitor", "overview", "parse_ids", "pause", "paused_queues",
    "prune_failed", "prune_results", "queue_stats", "reset_throttle", "result_retention",
    "resume", "retry", "run_now", "stats", "store_for", "usable_stores",
]
