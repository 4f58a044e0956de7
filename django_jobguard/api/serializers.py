"""Request and response bodies of the REST API (also what the OpenAPI schema describes)."""

from __future__ import annotations

import math
from typing import Any

from rest_framework import serializers

from django_jobguard import operations
from django_jobguard.models import FailedJob, QueuedJob

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


# -- queued and failed jobs --------------------------------------------------------------


class QueuedJobSerializer(serializers.ModelSerializer):
    state = serializers.ChoiceField(choices=operations.STATES, source="jobguard_state",
                                    read_only=True)

    class Meta:
        model = QueuedJob
        fields = ["id", "name", "queue", "state", "attempts", "exceptions", "priority",
                  "available_at", "reserved_at", "reserved_by", "created_at", "last_error",
                  "payload"]
        read_only_fields = fields


class JobFilterSerializer(serializers.Serializer):
    """Query parameters of ``GET jobs/``."""

    queue = serializers.CharField(required=False, allow_blank=True, max_length=100)
    state = serializers.ChoiceField(choices=operations.STATES, required=False,
                                    allow_blank=True)
    name = serializers.CharField(required=False, allow_blank=True, max_length=255)


class FailedJobSerializer(serializers.ModelSerializer):
    class Meta:
        model = FailedJob
        fields = ["id", "name", "queue", "attempts", "priority", "exception_class", "message",
                  "failed_at", "payload"]
        read_only_fields = fields


class FailedJobDetailSerializer(FailedJobSerializer):
    class Meta(FailedJobSerializer.Meta):
        fields = [*FailedJobSerializer.Meta.fields, "traceback", "last_error"]
        read_only_fields = fields


class FailedJobFilterSerializer(serializers.Serializer):
    """Query parameters of ``GET failed-jobs/``."""

    queue = serializers.CharField(required=False, allow_blank=True, max_length=100)
    name = serializers.CharField(required=False, allow_blank=True, max_length=255)


class RetryAllSerializer(serializers.Serializer):
    """Body of ``POST failed-jobs/retry-all/``: optionally only one queue."""

    queue = TextField(required=False, max_length=100)


class RetriedSerializer(serializers.Serializer):
    retried = serializers.IntegerField()
    ids = serializers.ListField(child=serializers.UUIDField())


# -- locks, throttles, stats -------------------------------------------------------------


class StoreQuerySerializer(serializers.Serializer):
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


class ThrottleSerializer(serializers.Serializer):
    key = serializers.CharField(source="info.key")
    kind = serializers.ChoiceField(choices=["rate", "circuit"], source="info.kind")
    hits = serializers.IntegerField(source="info.hits",
                                    help_text="Requests in the window / failures counted.")
    limit = serializers.IntegerField(source="info.limit",
                                     help_text="Allowed per window / failures before opening.")
    state = serializers.CharField(source="info.state",
                                  help_text="Circuits: closed, open or half-open.")
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


class DispatchSerializer(serializers.Serializer):
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

    def validate_args(self, value: list) -> list:
        check_json_text(value, path="args")
        return value

    def validate_kwargs(self, value: dict) -> dict:
        check_json_text(value, path="kwargs")
        return value

    def validate_delay(self, value: float) -> float:
        if not math.isfinite(value):
            raise serializers.ValidationError("A finite number of seconds is required.")
        return value


class DispatchedSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    job = serializers.CharField()
    queue = serializers.CharField()


class SkippedSerializer(serializers.Serializer):
    skipped = serializers.CharField(help_text='"unique": a copy of this unique job is queued.')
    job = serializers.CharField()
