"""Finding jobs: the filters that the admin, the API and the commands share.

A :class:`JobSearch` narrows queued or failed jobs by job name (a django.tasks task's own
dotted name too, see :func:`~django_jobguard.registry.display_name`), queue, state (queued
jobs), exception class (failed jobs) and values inside the arguments: ``args__0=42`` or
``kwargs__invoice_id=7``, the value written as JSON (``"abc"`` for a string, ``42``, ``true``,
``null``), compared as JSON with Django's ``JSONField`` key lookups on every database, so
``42`` does not match ``"42"``. A ``kwargs__<name>`` lookup also finds the argument passed by
position, through the job class's signature: ``kwargs__customer_id=9`` finds
``NotifyCustomer(9, ...)`` when ``customer_id`` is its first parameter. ``tag`` narrows to
jobs carrying a tag (:mod:`django_jobguard.tags`). Bad input raises :class:`SearchError`
naming the parameter.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django.db import connections
from django.db.models import CharField, Func, Q, QuerySet
from django.db.models.fields.json import KeyTransform

from django_jobguard import registry, tags
from django_jobguard.conf import queue_database
from django_jobguard.models import STATES, FailedJob, QueuedJob, QueuedJobQuerySet
from django_jobguard.operations.pausing import QueueNameError, check_queue_name, is_known_queue

#: The two roots an argument lookup starts from: positional and keyword arguments.
ARGUMENT_ROOTS = ("args", "kwargs")
#: How deep an argument lookup may reach (``kwargs__customer__address__city``: 3 below).
MAX_ARGUMENT_DEPTH = 8
#: Argument lookups one search may combine.
MAX_ARGUMENT_FILTERS = 10


class SearchError(ValueError):
    """A filter that cannot be applied; ``param`` names it (``queue``, ``kwargs__id``)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message


def is_argument_param(name: str) -> bool:
    """Whether a query parameter is an argument lookup (``args__…`` / ``kwargs__…``)."""
    return name.partition("__")[0] in ARGUMENT_ROOTS and "__" in name


def parse_argument(name: str, raw: str) -> tuple[tuple[str, ...], Any]:
    """``("kwargs", "invoice_id"), 7`` from ``kwargs__invoice_id`` and ``"7"``;
    :class:`SearchError` for a malformed name or a value that is not one JSON scalar."""
    if not _storable(name) or not _storable(raw):
        raise SearchError(name.encode("utf-8", "backslashreplace").decode("utf-8"),
                          "An argument lookup cannot contain NUL characters or invalid "
                          "Unicode.")
    path = tuple(name.split("__"))
    if path[0] not in ARGUMENT_ROOTS or len(path) < 2:
        raise SearchError(name, f"{name!r} is not an argument lookup: write args__<index> or "
                                f"kwargs__<name> (deeper: kwargs__customer__id).")
    if any(not part or part.strip() != part for part in path[1:]):
        raise SearchError(name, f"{name!r} has an empty or blank key between '__'.")
    if len(path) - 1 > MAX_ARGUMENT_DEPTH:
        raise SearchError(name, f"{name!r} reaches deeper than {MAX_ARGUMENT_DEPTH} levels.")
    if path[0] == "args" and not path[1].isdigit():
        raise SearchError(name, f"{name!r}: positional arguments are numbered from 0 "
                                f"(args__0), not {path[1]!r}.")
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        raise SearchError(name, f"{name}: {raw!r} is not valid JSON; write a number (42), "
                                f"a string in double quotes (\"abc\"), true, false or "
                                f"null.") from None
    if isinstance(value, (dict, list)):
        raise SearchError(name, f"{name}: compare one value (a number, a string, true, false "
                                f"or null), not a JSON {type(value).__name__}; reach inside "
                                f"it with a longer lookup ({name}__<key>).")
    if isinstance(value, str) and not _storable(value):
        raise SearchError(name, f"{name}: the value cannot contain NUL characters or invalid "
                                f"Unicode.")
    if isinstance(value, float) and not math.isfinite(value):
        raise SearchError(name, f"{name}: {raw!r} is not a finite number.")
    return path, value


def _storable(text: Any) -> bool:
    """Text a database can compare: no NUL, no lone surrogates."""
    if not isinstance(text, str):
        return False
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse_arguments(params: Mapping[str, Any] | Iterable[tuple[str, Any]]
                    ) -> tuple[tuple[tuple[str, ...], Any], ...]:
    """Every argument lookup among ``params`` (a mapping or ``(name, value)`` pairs), parsed;
    other names are left out. A name given twice is an error (it would match nothing)."""
    items = params.items() if isinstance(params, Mapping) else params
    parsed: dict[tuple[str, ...], Any] = {}
    for name, raw in items:
        if not is_argument_param(name):
            continue
        path, value = parse_argument(name, raw)
        if path in parsed:
            raise SearchError(name, f"{name} is given twice.")
        parsed[path] = value
    if len(parsed) > MAX_ARGUMENT_FILTERS:
        raise SearchError("args", f"At most {MAX_ARGUMENT_FILTERS} argument lookups at once.")
    return tuple(parsed.items())


def check_queue(name: str, *, using: str | None = None) -> str:
    """``name`` if it is a queue jobguard knows (:func:`is_known_queue`), else
    :class:`SearchError` (a typo must not look like an empty queue)."""
    using = queue_database(using)
    try:
        name = check_queue_name(name)
    except QueueNameError as exc:
        raise SearchError("queue", str(exc)) from None
    if not is_known_queue(name, using=using):
        raise SearchError("queue", f"Unknown queue {name!r}: no job, worker or registered job "
                                   f"uses it.")
    return name


def name_q(name: str, *, result: bool = False) -> Q:
    """Rows of job ``name``: its registered name, or the name an adapter job shows (a
    django.tasks task's dotted path, found inside the payload)."""
    condition = Q(name=name)
    for adapter, path in registry.display_paths(result=result).items():
        condition |= Q(name=adapter, **{"payload__" + "__".join(path): name})
    return condition


def exception_q(name: str) -> Q:
    """Failed jobs whose exception is ``name``: its dotted path, or its class name alone
    (``TimeoutError`` matches ``builtins.TimeoutError`` and ``requests.exceptions.Timeout``
    only when written in full)."""
    return Q(exception_class=name) | Q(exception_class__endswith=f".{name}")


@dataclass(frozen=True)
class JobSearch:
    """Filters for queued or failed jobs; empty fields do not narrow."""

    name: str = ""
    queue: str = ""
    #: Queued jobs only: ``waiting``, ``delayed`` or ``reserved``.
    state: str = ""
    #: Failed jobs only: the exception's dotted path or class name.
    exception: str = ""
    #: ``((("kwargs", "invoice_id"), 7), ...)`` from :func:`parse_arguments`.
    arguments: tuple[tuple[tuple[str, ...], Any], ...] = ()
    #: Jobs carrying this tag.
    tag: str = ""

    @classmethod
    def from_params(cls, params: Mapping[str, Any] | Iterable[tuple[str, Any]], *,
                    failed: bool, using: str | None = None) -> JobSearch:
        """A search from query parameters (``name``, ``queue``, ``state`` or ``exception``,
        and argument lookups), each checked: :class:`SearchError` names a bad one. Give
        ``(name, value)`` pairs to keep repeated names: an argument lookup given twice is an
        error, not its last value."""
        using = queue_database(using)
        pairs = list(params.items() if isinstance(params, Mapping) else params)
        params = dict(pairs)
        state = "" if failed else (params.get("state") or "")
        if state and state not in STATES:
            raise SearchError("state", f"Unknown state {state!r}; expected one of "
                                       f"{', '.join(STATES)}.")
        queue = params.get("queue") or ""
        return cls(name=(params.get("name") or "").strip(),
                   queue=check_queue(queue, using=using) if queue else "",
                   state=state,
                   exception=(params.get("exception") or "").strip() if failed else "",
                   arguments=parse_arguments(pairs), tag=check_tag(params.get("tag") or ""))

    def __bool__(self) -> bool:
        return any((self.name, self.queue, self.state, self.exception, self.arguments,
                    self.tag))

    def describe(self) -> str:
        """``name 'x', queue 'y', kwargs__id = 7`` for messages and the audit log."""
        parts = [f"{label} {value!r}" for label, value in (
            ("name", self.name), ("queue", self.queue), ("state", self.state),
            ("exception", self.exception), ("tag", self.tag)) if value]
        parts += [f"{'__'.join(path)} = {json.dumps(value)}" for path, value in self.arguments]
        return ", ".join(parts) or "everything"

    def apply(self, rows: QuerySet) -> QuerySet:
        """``rows`` narrowed by these filters."""
        if self.name:
            rows = rows.filter(name_q(self.name))
        if self.queue:
            rows = rows.filter(queue=self.queue)
        if self.state:
            assert isinstance(rows, QueuedJobQuerySet)  # only queued jobs have a state
            rows = rows.in_state(self.state)
        if self.exception:
            rows = rows.filter(exception_q(self.exception))
        if self.tag:
            rows = rows.filter(tags.lookup(self.tag))
        return filter_arguments(rows, self.arguments)

    def queued_jobs(self, *, using: str | None = None) -> QuerySet[QueuedJob]:
        using = queue_database(using)
        return self.apply(QueuedJob.objects.using(using).all())

    def failed_jobs(self, *, using: str | None = None) -> QuerySet[FailedJob]:
        using = queue_database(using)
        return self.apply(FailedJob.objects.using(using).all())


def check_tag(value: str) -> str:
    """``value`` (stripped) if it could be a tag, ``""`` for none; :class:`SearchError`
    saying what is wrong otherwise."""
    value = value.strip()
    if value:
        try:
            tags.validate([value], owner="tag")
        except (TypeError, ValueError) as exc:
            raise SearchError("tag", str(exc)) from None
    return value


def filter_arguments(rows: QuerySet, arguments: tuple[tuple[tuple[str, ...], Any], ...], *,
                     field: str = "payload") -> QuerySet:
    """``rows`` whose arguments (the JSON in ``field``: ``{"args": [...], "kwargs": {...}}``)
    match every lookup of ``arguments``. A ``kwargs__<name>`` lookup matches the keyword
    argument, or, for each registered job that takes ``<name>`` by position, that
    positional argument of its rows (:func:`~django_jobguard.registry.positional_index`)."""
    strict_types = connections[rows.db].vendor == "mysql"
    for i, (path, value) in enumerate(arguments):
        where = Q()
        for j, (names, at) in enumerate(_alternatives(path)):
            alias = f"jobguard_arg{i}_{j}"
            rows = rows.alias(**{alias: argument(at, field)})
            match = Q(**{alias: value})
            if strict_types:  # Django compares unquoted text there: 42 would match "42"
                rows = rows.alias(**{f"{alias}_type": Func(
                    argument(at, field), function="JSON_TYPE", output_field=CharField())})
                match &= Q(**{f"{alias}_type__in": _MYSQL_JSON_TYPES[_json_kind(value)]})
            if names is not None:
                match &= Q(name__in=names)
            where |= match
        rows = rows.filter(where)
    return rows


def _alternatives(path: tuple[str, ...]) -> list[tuple[list[str] | None, tuple[str, ...]]]:
    """Where the value of lookup ``path`` may be: ``(None, path)`` (any job), and for
    ``kwargs__<name>…`` ``(job names, ("args", "<index>", …))`` per position that registered
    jobs take ``<name>`` at."""
    found: list[tuple[list[str] | None, tuple[str, ...]]] = [(None, path)]
    if path[0] != "kwargs":
        return found
    by_index: dict[int, list[str]] = {}
    for name, job_class in sorted(registry.all_jobs().items()):
        index = registry.positional_index(job_class, path[1])
        if index is not None:
            by_index.setdefault(index, []).append(name)
    found += [(names, ("args", str(index), *path[2:])) for index, names in by_index.items()]
    return found


#: What MariaDB's / MySQL's ``JSON_TYPE`` says for each kind of JSON scalar.
_MYSQL_JSON_TYPES = {
    "string": ["STRING"], "boolean": ["BOOLEAN"], "null": ["NULL"],
    "number": ["INTEGER", "UNSIGNED INTEGER", "DOUBLE", "DECIMAL"],
}


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return "string" if isinstance(value, str) else "number"


def argument(path: tuple[str, ...], field: str = "payload") -> KeyTransform:
    """The value at ``path`` of the JSON in ``field`` (the payload; a finished run's
    ``arguments``) as a JSON expression: compared with ``=`` it is a JSON comparison (a key
    lookup), whatever the keys are called (a key named ``contains`` is a key, not Django's
    lookup of that name)."""
    expression: Any = field
    for key in path:
        expression = KeyTransform(key, expression)
    return expression


def result_name_q(name: str) -> Q:
    """Job results of job ``name`` (a django.tasks task's own dotted name too)."""
    return name_q(name, result=True)


__all__ = ["ARGUMENT_ROOTS", "JobSearch", "SearchError", "argument", "check_queue",
           "check_tag", "exception_q", "filter_arguments", "is_argument_param", "name_q",
           "parse_argument", "parse_arguments", "result_name_q"]
