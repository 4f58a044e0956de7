"""Request and response bodies of the REST API (also what the OpenAPI schema describes)."""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from rest_framework import serializers
from rest_framework.exceptions import ErrorDetail

from django_jobguard import operations, registry
from django_jobguard import queue as job_queue
from django_jobguard import tags as job_tags
from django_jobguard.models import (
    Batch,
    FailedJob,
    FinishedRun,
    QueuedJob,
    Worker,
    may_view_arguments,
)
from django_jobguard.progress import stored_fraction

MAX_DELAY_SECONDS = 366 * 24 * 3600
#: Lock and throttle keys: printable text, at most as long as the ``Lock.key`` column.
KEY_PATTERN = r"^[^\x00-\x1f\x7f]{1,255}$"


class TextField(serializers.CharField):
    """A ``CharField`` that takes only JSON strings as they are: DRF would turn ``0`` into
    ``"0"`` and strip whitespace (a queue named ``" a"`` is not queue ``"a"``)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class ErrorSerializer(serializers.Serializer):
    """Every error body: a message, a machine-readable code and, for bad input, field errors."""

    detail = serializers.CharField()
    code = serializers.CharField()
    errors = serializers.DictField(child=serializers.ListField(child=serializers.CharField()),
                                   required=False)


# -- strict input ------------------------------------------------------------------------

#: The error code of a key that no field of the request reads (``exception_handler`` reports
#: an error made only of these as ``code: "unknown_field"``, not as ``invalid``).
UNKNOWN_FIELD = "unknown_field"


class StrictSerializer(serializers.Serializer):
    """Input that refuses keys it has no field for: a typo (``dealy`` for ``delay``) must be
    a 400 naming it, not a request that silently does something else.

    Unknown keys are checked first and alone (a typo often explains a missing field): each
    gets an error with code ``unknown_field`` and, when one is close, a "did you mean" hint.
    Names that something other than this serializer reads (the paginator's ``page``) are
    passed as ``context["also_accepted"]``.
    """

    #: What the keys are called in messages, and what to say when there are none to take.
    noun: ClassVar[str] = "field"
    takes_none: ClassVar[str] = "this request takes no body"

    def accepted_names(self) -> list[str]:
        """Every key this input may carry: the writable fields, then ``also_accepted``."""
        own = [field.field_name for field in self._writable_fields]
        return own + [name for name in self.context.get("also_accepted", ()) if name not in own]

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):  # anything else: DRF's own "Expected a dictionary"
            accepted = self.accepted_names()
            unknown = [key for key in data if key not in accepted]
            if unknown:
                raise serializers.ValidationError(self.unknown_errors(unknown, accepted))
        return super().to_internal_value(data)

    def unknown_errors(self, names: Iterable[str],
                       accepted: list[str]) -> dict[str, list[ErrorDetail]]:
        """``{name: [message]}``, code ``unknown_field``, for each key not in ``accepted``."""
        errors = {}
        for name in names:
            message = f"unknown {self.noun} {name!r}"
            close = difflib.get_close_matches(name, accepted, n=1)
            if close:
                message += f" (did you mean {close[0]!r}?)"
            elif not self.fields:
                message += f" ({self.takes_none})"
            # The name is echoed as a key: escape what UTF-8 cannot carry (lone surrogates).
            key = name.encode("utf-8", "backslashreplace").decode("utf-8")
            errors[key] = [ErrorDetail(message, code=UNKNOWN_FIELD)]
        return errors


class QuerySerializer(StrictSerializer):
    """Query parameters: the same rule, so ``?staet=reserved`` is not a list of everything."""

    noun = "query parameter"
    takes_none = "this request takes no query parameters"


class NoBodySerializer(StrictSerializer):
    """What a request that takes no body may send: nothing, or ``{}``."""


class NoQuerySerializer(QuerySerializer):
    """The query string of a request that takes no query parameters."""


try:  # the schema says so too: request bodies are closed objects
    from drf_spectacular.extensions import OpenApiSerializerExtension

    class StrictSerializerSchema(OpenApiSerializerExtension):
        """``additionalProperties: false`` on request bodies made by a ``StrictSerializer``
        (wherever drf-spectacular meets one, so also in a project's own schema view)."""

        target_class = StrictSerializer
        match_subclasses = True

        def map_serializer(self, auto_schema: Any, direction: str) -> dict:
            schema = auto_schema._map_serializer(self.target, direction,
                                                 bypass_extensions=True)
            if direction == "request":
                schema["additionalProperties"] = False
            return schema
except ImportError:  # pragma: no cover - the API works without drf-spectacular
    pass


# -- queued and failed jobs --------------------------------------------------------------


class DisplayNameField(serializers.CharField):
    """The name operators know a job by: a django.tasks task's own dotted name, else the
    registered ``name`` (:func:`~django_jobguard.registry.display_name`)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("read_only", True)
        kwargs.setdefault("source", "*")
        kwargs.setdefault("help_text", "What runs: a django.tasks task's own dotted name, "
                                       "else the registered job name.")
        super().__init__(**kwargs)

    def to_representation(self, value: Any) -> str:
        return registry.display_name(value.name, value.payload)


class ProgressField(serializers.FloatField):
    """A job's stored progress, ``null`` when none was reported or the stored value is not a
    number from 0 to 1 (NaN or infinity would make the response invalid JSON)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("read_only", True)
        kwargs.setdefault("allow_null", True)
        kwargs.setdefault("help_text", "0 to 1, as the running job last reported; null when "
                                       "it reported none or the stored value is unreadable.")
        super().__init__(**kwargs)

    def to_representation(self, value: Any) -> float | None:
        return stored_fraction(value)


class TagsField(serializers.ListField):
    """A row's tags as a list of strings (:mod:`django_jobguard.tags`)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("read_only", True)
        kwargs.setdefault("child", serializers.CharField())
        kwargs.setdefault("help_text", "Tags set at dispatch or on the job class.")
        super().__init__(**kwargs)

    def to_representation(self, data: Any) -> list[str]:
        return job_tags.decode(data)


class HidesArguments(serializers.Serializer):
    """A row whose ``argument_fields`` are ``null`` for a user without ``view_job_arguments``
    (payloads may hold personal data); the rest of the row is shown."""

    argument_fields: ClassVar[tuple[str, ...]] = ("payload",)

    def to_representation(self, instance: Any) -> Any:
        data = super().to_representation(instance)
        if not self._arguments_shown():
            for name in self.argument_fields:
                if name in data:
                    data[name] = None
        return data

    def _arguments_shown(self) -> bool:
        shown = self.context.get("jobguard_arguments_shown")
        if shown is None:  # once per response, not per row
            request = self.context.get("request")
            shown = may_view_arguments(getattr(request, "user", None))
            self.context["jobguard_arguments_shown"] = shown
        return shown


class QueuedJobSerializer(HidesArguments, serializers.ModelSerializer):
    state = serializers.ChoiceField(choices=operations.STATES, source="jobguard_state",
                                    read_only=True)
    display_name = DisplayNameField()
    progress = ProgressField()
    tags = TagsField()
    stale = serializers.SerializerMethodField(
        help_text="Reserved by a worker that is gone (the admin's 'stale' flag): "
                  "POST jobs/{id}/requeue/ frees it now instead of at the lease's end.")
    stale_reason = serializers.SerializerMethodField(
        help_text="Why it is stale (worker ... is gone); empty when it is not.")

    class Meta:
        model = QueuedJob
        fields = ["id", "name", "display_name", "queue", "state", "attempts", "exceptions",
                  "priority", "available_at", "reserved_at", "reserved_by", "stale",
                  "stale_reason", "created_at", "wait_reason", "cancel_requested_at",
                  "progress", "progress_message", "last_error", "tags", "payload"]
        read_only_fields = fields

    def _stale(self, row: QueuedJob) -> str:
        stale = self.context.get("stale")
        if stale is None:  # serialized outside the viewset: this row alone
            stale = operations.stale_reservations([row])
        return stale.get(str(row.id), "")

    def get_stale(self, row: QueuedJob) -> bool:
        return bool(self._stale(row))

    def get_stale_reason(self, row: QueuedJob) -> str:
        return self._stale(row)


class CancelledSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    result = serializers.ChoiceField(choices=["deleted", "stopping"], help_text=(
        "deleted: no worker held it; stopping: the running job was asked to stop."))


class SearchQuerySerializer(QuerySerializer):
    """Query parameters that select jobs (lists and bulk actions): the declared fields plus
    argument lookups, ``args__<index>[__<key>…]=<JSON>`` and ``kwargs__<name>[__<key>…]=<JSON>``
    (``kwargs__invoice_id=7``, ``args__0="abc"``). ``validated_data["search"]`` is the
    :class:`~django_jobguard.operations.JobSearch`; a bad value is a 400 naming it."""

    failed: ClassVar[bool] = False

    def accepted_names(self) -> list[str]:
        names = super().accepted_names()
        data = self.initial_data if hasattr(self, "initial_data") else {}
        return names + [key for key in data if operations.search.is_argument_param(key)]

    def validate(self, attrs: dict) -> dict:
        data = self.initial_data
        lists = data.lists() if hasattr(data, "lists") else ((k, [v]) for k, v in data.items())
        # Every value of a repeated argument lookup, so that one given twice is a 400.
        raw = [*((key, value) for key, value in attrs.items() if value != ""),
               *((key, value) for key, values in lists
                 if operations.search.is_argument_param(key) for value in values)]
        try:
            attrs["search"] = operations.JobSearch.from_params(raw, failed=self.failed)
        except operations.SearchError as exc:
            raise serializers.ValidationError({exc.param: [exc.message]}) from None
        return attrs


class JobFilterSerializer(SearchQuerySerializer):
    """Query parameters of ``GET jobs/`` and ``POST jobs/delete/``."""

    queue = serializers.CharField(required=False, allow_blank=True, max_length=100,
                                  help_text="A queue jobguard knows (an unknown one is a 400).")
    state = serializers.ChoiceField(choices=operations.STATES, required=False,
                                    allow_blank=True)
    name = serializers.CharField(required=False, allow_blank=True, max_length=255,
                                 help_text="Job name; a django.tasks task's own dotted name "
                                           "too.")
    tag = serializers.CharField(required=False, allow_blank=True, max_length=100,
                                help_text="Only jobs carrying this tag.")


class BatchSerializer(serializers.ModelSerializer):
    status = serializers.CharField(read_only=True, help_text="running, cancelling, completed, "
                                                             "failed or cancelled")
    processed_jobs = serializers.IntegerField(read_only=True)
    progress = serializers.FloatField(read_only=True, help_text="0 to 1")

    class Meta:
        model = Batch
        fields = ["id", "name", "status", "total_jobs", "pending_jobs", "failed_jobs",
                  "processed_jobs", "progress", "failed_job_ids", "allow_failures",
                  "created_at", "cancelled_at", "finished_at"]
        read_only_fields = fields


class FailedJobSerializer(HidesArguments, serializers.ModelSerializer):
    display_name = DisplayNameField()
    tags = TagsField()

    class Meta:
        model = FailedJob
        fields = ["id", "name", "display_name", "queue", "attempts", "priority", "reason",
                  "exception_class", "message", "failed_at", "tags", "payload"]
        read_only_fields = fields


class FailedJobDetailSerializer(FailedJobSerializer):
    class Meta(FailedJobSerializer.Meta):
        fields = [*FailedJobSerializer.Meta.fields, "traceback", "last_error"]
        read_only_fields = fields


class FailedJobFilterSerializer(SearchQuerySerializer):
    """Query parameters of ``GET failed-jobs/`` and ``POST failed-jobs/retry/`` and
    ``failed-jobs/delete/``."""

    failed = True

    queue = serializers.CharField(required=False, allow_blank=True, max_length=100,
                                  help_text="A queue jobguard knows (an unknown one is a 400).")
    name = serializers.CharField(required=False, allow_blank=True, max_length=255,
                                 help_text="Job name; a django.tasks task's own dotted name "
                                           "too.")
    exception = serializers.CharField(required=False, allow_blank=True, max_length=255,
                                      help_text="Exception class: its dotted path or its "
                                                "name alone (TimeoutError).")
    tag = serializers.CharField(required=False, allow_blank=True, max_length=100,
                                help_text="Only jobs carrying this tag.")


class BulkRetriedSerializer(serializers.Serializer):
    retried = serializers.IntegerField(help_text="Failed jobs queued again.")
    skipped = serializers.IntegerField(help_text="Matches left alone: a queued job has "
                                                 "their id already.")


class BulkForgottenSerializer(serializers.Serializer):
    deleted = serializers.IntegerField(help_text="Failed jobs deleted.")


class BulkDeletedSerializer(serializers.Serializer):
    deleted = serializers.IntegerField(help_text="Queued jobs deleted (unique locks freed).")
    skipped = serializers.IntegerField(help_text="Matches left alone: a worker holds them.")


class RequeuedSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    result = serializers.ChoiceField(choices=["requeued"])


class RetryAllSerializer(StrictSerializer):
    """Body of ``POST failed-jobs/retry-all/``: optionally only one queue."""

    queue = TextField(required=False, max_length=100)


class RetriedSerializer(serializers.Serializer):
    retried = serializers.IntegerField()
    ids = serializers.ListField(child=serializers.UUIDField())


# -- paused queues -----------------------------------------------------------------------


class RunningJobSerializer(serializers.Serializer):
    id = serializers.CharField()
    name = serializers.CharField(help_text="The job's class as operators know it; empty when "
                                           "it finished meanwhile.")


class RunningJobsField(serializers.ListField):
    """The jobs a worker runs now, each with its class (one query per page: the view puts
    ``running_jobs`` in the context)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(child=RunningJobSerializer(), read_only=True, source="*",
                         help_text="The jobs it runs now.", **kwargs)

    def to_representation(self, data: Any) -> list[dict[str, str]]:
        names = self.context.get("running_jobs")
        if names is None:
            names = operations.running_jobs([data])
        return [{"id": job_id, "name": names.get(job_id, "")}
                for job_id in data.current_job.split(",") if job_id]


class WorkerSerializer(serializers.ModelSerializer):
    """A worker with its verdict, what it runs, and what was asked of it."""

    status = serializers.SerializerMethodField(
        help_text="alive, ended (its process on this host is gone), silent (no heartbeat for "
                  "RETRY_AFTER) or unknown.")
    queues = serializers.SerializerMethodField()
    running = RunningJobsField()

    class Meta:
        model = Worker
        fields = ["id", "hostname", "pid", "queues", "status", "state", "command",
                  "command_by", "command_at", "running", "jobs_processed", "done_last_minute",
                  "failed_last_minute", "started_at", "last_seen_at"]
        read_only_fields = fields

    def get_status(self, row: Worker) -> str:
        states = self.context.get("worker_states") or {}
        return states.get(row.id) or operations.worker_states([row.id]).get(row.id, "unknown")

    def get_queues(self, row: Worker) -> list[str]:
        return [name for name in row.queues.split(",") if name]



class WorkerCommandedSerializer(serializers.Serializer):
    id = serializers.CharField()
    command = serializers.ChoiceField(choices=["quiet", "stop"], help_text=(
        "What the worker now has: a quiet asked of a stopping worker leaves 'stop'."))


class PausedQueueSerializer(serializers.Serializer):
    queue = serializers.CharField()
    paused_at = serializers.DateTimeField()
    paused_by = serializers.CharField()


class PauseSerializer(StrictSerializer):
    """Body of ``POST queues/<queue>/pause/``: ``force`` pauses a queue nothing uses yet."""

    force = serializers.BooleanField(required=False, default=False)


# -- locks, throttles, stats -------------------------------------------------------------


class StoreQuerySerializer(QuerySerializer):
    """``?store=<alias>``: which store to read (default ``JOBGUARD['STORE']``)."""

    store = serializers.CharField(required=False, allow_blank=True, max_length=100)


class KeySerializer(serializers.Serializer):
    """A lock or throttle key from the URL: printable text of at most 255 characters."""

    key = serializers.CharField(max_length=255)

    def validate_key(self, value: str) -> str:
        if any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise serializers.ValidationError("Keys do not contain control characters.")
        return value


class LockSerializer(serializers.Serializer):
    key = serializers.CharField(source="info.key")
    kind = serializers.CharField(source="info.kind")
    owner = serializers.CharField(source="info.owner")
    token = serializers.IntegerField(source="info.token", help_text="Fencing token.")
    acquired_at = serializers.DateTimeField(source="info.acquired_at", allow_null=True)
    expires_at = serializers.DateTimeField(source="info.expires_at", allow_null=True)
    expires_in = serializers.FloatField(allow_null=True,
                                        help_text="Seconds left (negative: expired); "
                                                  "null: never expires.")
    job_id = serializers.CharField(source="info.job_id")
    store = serializers.CharField(source="info.store")
    stale = serializers.BooleanField()
    stale_reason = serializers.CharField()


class LockPageQuerySerializer(StoreQuerySerializer):
    """Query parameters of ``GET locks/``: a keyed page, narrowed by kind and key prefix."""

    kind = serializers.ChoiceField(choices=operations.LOCK_KINDS, required=False,
                                   allow_blank=True)
    prefix = serializers.CharField(required=False, allow_blank=True, max_length=255,
                                   help_text="Keys starting with this (jobguard:<kind>: may "
                                             "be left out).")
    cursor = serializers.CharField(required=False, allow_blank=True, max_length=300,
                                   help_text="From the previous page's next link.")
    page_size = serializers.IntegerField(required=False, min_value=1, max_value=500,
                                         default=100)


class LockPageSerializer(serializers.Serializer):
    """A page of locks: ``next`` links to the following page (null after the last)."""

    next = serializers.URLField(allow_null=True)
    results = LockSerializer(many=True)


class ThrottleSerializer(serializers.Serializer):
    key = serializers.CharField(source="info.key")
    kind = serializers.ChoiceField(choices=["rate", "circuit"], source="info.kind")
    hits = serializers.IntegerField(source="info.hits",
                                    help_text="Requests in the window / failures counted.")
    limit = serializers.IntegerField(source="info.limit",
                                     help_text="Allowed per window / failures before opening.")
    state = serializers.CharField(source="info.state",
                                  help_text="Circuits: closed, open or half-open. "
                                            "'unreadable' (hits 0) when the stored state "
                                            "cannot be decoded: reset it.")
    resets_at = serializers.DateTimeField(source="info.resets_at", allow_null=True)
    resets_in = serializers.FloatField(allow_null=True)
    store = serializers.CharField(source="info.store")


class QueueStatsSerializer(serializers.Serializer):
    waiting = serializers.IntegerField()
    delayed = serializers.IntegerField()
    reserved = serializers.IntegerField()
    failed = serializers.IntegerField()


class StatsSerializer(serializers.Serializer):
    queues = serializers.DictField(child=QueueStatsSerializer())
    workers = serializers.IntegerField(help_text="Workers with a recent heartbeat.")
    done_last_minute = serializers.IntegerField(
        help_text="Jobs finished in the last 60 s, as counted by live workers at their last "
                  "heartbeat.")
    failed_last_minute = serializers.IntegerField()


class QueueOverviewSerializer(QueueStatsSerializer):
    estimated = serializers.BooleanField(
        help_text="A count is over 10,000: PostgreSQL's planner estimate, not exact.")
    oldest_waiting_at = serializers.DateTimeField(
        allow_null=True, help_text="When the longest-waiting job became due.")
    oldest_waiting_seconds = serializers.FloatField(allow_null=True)
    done_last_hour = serializers.IntegerField()
    failed_last_hour = serializers.IntegerField()
    paused = serializers.BooleanField()
    unserved = serializers.BooleanField(
        help_text="Jobs wait and no live worker serves the queue.")
    breached = serializers.ListField(
        child=serializers.CharField(), default=list,
        help_text="The queue's breached objectives (max_wait, max_failure_rate).")
    recommended_workers = serializers.IntegerField(
        default=0, help_text="The worker count the queue needs (Little's law), as the "
                             "dashboard's Workers needed column.")


class WorkerOverviewSerializer(serializers.Serializer):
    id = serializers.CharField()
    hostname = serializers.CharField()
    pid = serializers.IntegerField()
    queues = serializers.ListField(child=serializers.CharField())
    current_job = serializers.CharField()
    last_seen_at = serializers.DateTimeField()
    seconds_since_heartbeat = serializers.FloatField()
    jobs_processed = serializers.IntegerField()


class StoreOverviewSerializer(serializers.Serializer):
    store = serializers.CharField()
    held_locks = serializers.IntegerField(allow_null=True,
                                          help_text="Counted up to 10,001.")
    open_circuits = serializers.IntegerField(allow_null=True)
    error = serializers.CharField(help_text="Why the store could not be read, or empty.")


class QueueSeriesSerializer(serializers.Serializer):
    done = serializers.ListField(child=serializers.FloatField(),
                                 help_text="Jobs/min done, one per point, oldest first.")
    failed = serializers.ListField(child=serializers.FloatField())
    total_done = serializers.IntegerField()
    total_failed = serializers.IntegerField()


class SeriesSerializer(serializers.Serializer):
    start = serializers.DateTimeField(help_text="The first point's minute.")
    step_minutes = serializers.IntegerField()
    queues = serializers.DictField(child=QueueSeriesSerializer())


class HistorySerializer(serializers.Serializer):
    last_hour = SeriesSerializer(source="1h", help_text="60 points of 1 minute.")
    last_day = SeriesSerializer(source="24h", help_text="24 points, one per clock hour (UTC).")


class StatsHistorySerializer(serializers.Serializer):
    generated_at = serializers.DateTimeField()
    queues = serializers.DictField(child=QueueOverviewSerializer())
    workers = WorkerOverviewSerializer(many=True)
    done_last_minute = serializers.IntegerField()
    failed_last_minute = serializers.IntegerField()
    stores = StoreOverviewSerializer(many=True)
    history = HistorySerializer()


# -- finished runs (history) -------------------------------------------------------------


class FinishedRunSerializer(HidesArguments, serializers.ModelSerializer):
    tags = TagsField()
    argument_fields = ("arguments",)

    class Meta:
        model = FinishedRun
        fields = ["id", "job_id", "name", "queue", "state", "arguments", "attempt", "worker",
                  "started_at", "finished_at", "runtime", "wait", "result_size", "error",
                  "tags"]
        read_only_fields = fields


class FinishedRunFilterSerializer(QuerySerializer):
    """Query parameters of ``GET runs/``. As in the other lists, an empty value is the same as
    none (DRF reads query strings as form input), so the schema allows it."""

    name = serializers.CharField(required=False, allow_blank=True, max_length=255,
                                 help_text="Job name (exact).")
    queue = serializers.CharField(required=False, allow_blank=True, max_length=100)
    state = serializers.ChoiceField(required=False, allow_blank=True, choices=[
        "DONE", "SKIPPED", "DELETED", "CANCELLED", "FAILED"])
    arguments = serializers.CharField(required=False, allow_blank=True, max_length=255,
                                      help_text="Text the run's arguments (JSON) contain.")
    tag = serializers.CharField(required=False, allow_blank=True, max_length=100,
                                help_text="Only jobs carrying this tag.")
    since = serializers.CharField(required=False, allow_blank=True, max_length=64,
                                  help_text="Finished at or after (ISO 8601 date and time).")
    until = serializers.CharField(required=False, allow_blank=True, max_length=64,
                                  help_text="Finished before (ISO 8601 date and time).")

    def accepted_names(self) -> list[str]:
        data = self.initial_data if hasattr(self, "initial_data") else {}
        return super().accepted_names() + [
            key for key in data if operations.search.is_argument_param(key)]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = {key: value for key, value in attrs.items() if value != ""}
        data = self.initial_data
        lists = data.lists() if hasattr(data, "lists") else ((k, [v]) for k, v in data.items())
        try:
            attrs["lookups"] = operations.search.parse_arguments(
                [(key, value) for key, values in lists
                 if operations.search.is_argument_param(key) for value in values])
            attrs["tag"] = operations.search.check_tag(attrs.get("tag", ""))
        except operations.SearchError as exc:
            raise serializers.ValidationError({exc.param: [exc.message]}) from None
        for key in ("since", "until"):
            if key in attrs:
                try:
                    attrs[key] = serializers.DateTimeField().to_internal_value(attrs[key])
                except serializers.ValidationError as exc:
                    raise serializers.ValidationError({key: exc.detail}) from None
        if "since" in attrs and "until" in attrs and attrs["since"] >= attrs["until"]:
            raise serializers.ValidationError({"until": ["must be later than 'since'."]})
        return attrs


class RunStatisticsQuerySerializer(QuerySerializer):
    """Query parameters of ``GET runs/statistics/``."""

    window = serializers.ChoiceField(choices=["1h", "24h", "7d"], default="24h", required=False,
                                     allow_blank=True)


class RunStatisticSerializer(serializers.Serializer):
    name = serializers.CharField()
    queue = serializers.CharField()
    runs = serializers.IntegerField()
    failures = serializers.IntegerField()
    runtime_p50 = serializers.FloatField(allow_null=True)
    runtime_p95 = serializers.FloatField(allow_null=True)
    runtime_max = serializers.FloatField(allow_null=True)
    wait_p50 = serializers.FloatField(allow_null=True)
    wait_p95 = serializers.FloatField(allow_null=True)
    wait_max = serializers.FloatField(allow_null=True)
    estimated = serializers.BooleanField(
        default=False, help_text="Over 10,000 runs in the window: the percentiles come from "
                                 "per-minute and per-hour histograms (within 9 %), not from "
                                 "every run.")


class RunStatisticsSerializer(serializers.Serializer):
    window = serializers.CharField()
    classes = RunStatisticSerializer(many=True)


# -- dispatch ----------------------------------------------------------------------------


def check_json_text(value: Any, *, path: str, depth: int = 0) -> None:
    """Reject what the databases cannot store in JSON: NUL characters, lone surrogates."""
    if depth > 32:
        raise serializers.ValidationError(f"{path} is nested too deeply.")
    if isinstance(value, str):
        if "\x00" in value:
            raise serializers.ValidationError(f"{path} contains a NUL character.")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise serializers.ValidationError(f"{path} is not valid Unicode text.")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_json_text(item, path=f"{path}[{i}]", depth=depth + 1)
    elif isinstance(value, dict):
        for key, item in value.items():
            check_json_text(key, path=f"{path} key {key!r}", depth=depth + 1)
            check_json_text(item, path=f"{path}[{key!r}]", depth=depth + 1)


class DispatchSerializer(StrictSerializer):
    """Body of ``POST dispatch/``."""

    job = TextField(max_length=255, help_text="Registered job name.")
    args = serializers.ListField(child=serializers.JSONField(allow_null=True), required=False,
                                 default=list)
    kwargs = serializers.DictField(child=serializers.JSONField(allow_null=True),
                                   required=False, default=dict)
    queue = TextField(required=False, max_length=100, help_text="Default: the job's queue.")
    delay = serializers.FloatField(required=False, min_value=0, max_value=MAX_DELAY_SECONDS,
                                   help_text="Seconds before the job may run.")
    priority = serializers.IntegerField(required=False, min_value=-100, max_value=100)
    tags = serializers.ListField(child=serializers.CharField(), required=False, default=list,
                                 help_text="Tags added to the job class's own.")

    def validate_tags(self, value: list) -> list:
        try:
            return list(job_tags.validate(value, owner="tags"))
        except (TypeError, ValueError) as exc:
            raise serializers.ValidationError(str(exc)) from None

    def validate_args(self, value: list) -> list:
        check_json_text(value, path="args")
        return value

    def validate_kwargs(self, value: dict) -> dict:
        check_json_text(value, path="kwargs")
        return value

    def validate_queue(self, value: str) -> str:
        problem = job_queue.queue_name_problem(value)
        if problem is not None:
            raise serializers.ValidationError(problem)
        return value

    def validate_delay(self, value: float) -> float:
        if not math.isfinite(value):
            raise serializers.ValidationError("A finite number of seconds is required.")
        return value


class DispatchedSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    job = serializers.CharField()
    queue = serializers.CharField()


class ScheduleRunSerializer(DispatchedSerializer):
    schedule = serializers.CharField()


class SkippedSerializer(serializers.Serializer):
    skipped = serializers.CharField(help_text='"unique": a copy of this unique job is queued.')
    job = serializers.CharField()


class ScheduleSerializer(serializers.Serializer):
    """A periodic schedule with its last recorded tick and its next one (UTC)."""

    name = serializers.CharField()
    job = serializers.CharField()
    cron = serializers.CharField()
    timezone = serializers.CharField()
    catch_up = serializers.CharField()
    enabled = serializers.BooleanField()
    last_tick = serializers.DateTimeField(allow_null=True)
    last_job_id = serializers.CharField()
    last_skipped = serializers.CharField(help_text="Why the last tick queued no job: "
                                                   "'unique' or 'missed'; empty otherwise.")
    next_tick = serializers.DateTimeField(allow_null=True)
