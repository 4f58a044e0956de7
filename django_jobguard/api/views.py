"""REST endpoints for operators: queued and failed jobs, locks, throttles, stats, dispatch.

Every view uses ``JOBGUARD['API_PERMISSION_CLASSES']`` (default ``JobGuardAdminPermissions``:
staff with the admin's model permissions), JSON in and out, page-number pagination, and one
error body: ``{"detail", "code"[, "errors"]}``. Input is strict: a body field or query
parameter that nothing reads is a 400 ``unknown_field``.
"""

from __future__ import annotations

import inspect
import types
import typing
import uuid
from typing import Any

from django.db import IntegrityError
from django.http import Http404
from rest_framework import exceptions, mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.generics import GenericAPIView, ListAPIView
from rest_framework.pagination import PageNumberPagination
from rest_framework.parsers import JSONParser
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.utils.urls import replace_query_param
from rest_framework.views import APIView
from rest_framework.views import exception_handler as drf_exception_handler

from django_jobguard import operations, registry, schedules, serialization
from django_jobguard.api import serializers as s
from django_jobguard.api.permissions import api_permission_classes
from django_jobguard.conf import jobguard_settings
from django_jobguard.decorators import FunctionJob
from django_jobguard.jobs import Job
from django_jobguard.models import Batch, FailedJob, QueuedJob
from django_jobguard.operations import monitoring
from django_jobguard.workflows import batches

try:
    from drf_spectacular.openapi import AutoSchema
    from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
    from drf_spectacular.utils import extend_schema as _extend_schema

    def extend_schema(**kwargs: Any):
        """drf-spectacular's decorator, based on its AutoSchema even when the project's
        ``REST_FRAMEWORK['DEFAULT_SCHEMA_CLASS']`` is DRF's own."""

        def decorate(method: Any) -> Any:
            method.schema = AutoSchema
            return _extend_schema(**kwargs)(method)

        return decorate
except ImportError:  # the API works without drf-spectacular; only the schema is missing
    AutoSchema = None

    def extend_schema(*args: Any, **kwargs: Any):
        return lambda view: view


# -- errors ------------------------------------------------------------------------------


class Conflict(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "The request conflicts with the current state."
    default_code = "conflict"


class NotSupported(exceptions.APIException):
    status_code = status.HTTP_501_NOT_IMPLEMENTED
    default_detail = "The store does not support this operation."
    default_code = "not_supported"


def _code(exc: Exception) -> str:
    if isinstance(exc, Http404):
        return "not_found"
    if isinstance(exc, exceptions.APIException):
        codes = exc.get_codes()
        return codes if isinstance(codes, str) else exc.default_code
    return "permission_denied"


#: How many unknown fields ``detail`` names (``errors`` has them all).
UNKNOWN_IN_DETAIL = 10


def exception_handler(exc: Exception, context: dict) -> Response | None:
    """DRF's handler, reshaped so every error has ``detail`` and ``code``, and validation
    errors list their fields under ``errors``. Unknown fields keep their own code,
    ``unknown_field``, with the messages (and their "did you mean" hints) as ``detail``."""
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        errors = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        flat = _flatten(errors)
        if _only_unknown_fields(exc):
            response.data = {"detail": _unknown_detail(flat), "code": s.UNKNOWN_FIELD,
                             "errors": flat}
        else:
            response.data = {"detail": "Invalid input.", "code": "invalid", "errors": flat}
    else:
        detail = response.data.get("detail", "") if isinstance(response.data, dict) else ""
        response.data = {"detail": str(detail or response.status_text), "code": _code(exc)}
    return response


def _only_unknown_fields(exc: exceptions.ValidationError) -> bool:
    """Whether every error of ``exc`` is an unknown field (``StrictSerializer`` checks
    those first and alone, so they never come mixed with other errors)."""
    codes = exc.get_codes()
    return (isinstance(codes, dict) and bool(codes)
            and all(isinstance(c, list) and c and set(c) == {s.UNKNOWN_FIELD}
                    for c in codes.values()))


def _unknown_detail(errors: dict[str, list[str]]) -> str:
    """``unknown field 'dealy' (did you mean 'delay'?); unknown field 'x'``, at most
    ``UNKNOWN_IN_DETAIL`` of them, so a body of a thousand keys gets a short answer."""
    messages = [message for field_messages in errors.values() for message in field_messages]
    shown = "; ".join(messages[:UNKNOWN_IN_DETAIL])
    more = len(messages) - UNKNOWN_IN_DETAIL
    return f"{shown}; and {more} more" if more > 0 else shown


def _flatten(errors: dict) -> dict[str, list[str]]:
    """Nested serializer errors as ``{"field": ["message", ...]}`` with dotted field paths."""
    out: dict[str, list[str]] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), item)
        elif isinstance(value, list) and value and not all(isinstance(v, str) for v in value):
            for index, item in enumerate(value):
                walk(f"{prefix}.{index}", item)
        else:
            out.setdefault(prefix, []).extend(str(v) for v in (value if isinstance(value, list)
                                                               else [value]))

    walk("", errors)
    return out


def _errors(*codes: int) -> dict[int, Any]:
    """Error responses to document; 400 is on every operation (a malformed ``Host`` header
    is refused by Django before the view runs)."""
    return {code: s.ErrorSerializer for code in sorted({400, *codes})}


READ_ERRORS = (400, 401, 403)
ONE_ERRORS = (400, 401, 403, 404)


# -- the shared base ---------------------------------------------------------------------


class Pagination(PageNumberPagination):
    """``?page=N&page_size=M`` (1 to 500, default 50); a bad ``page_size`` is a 400."""

    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500

    def get_page_size(self, request: Any) -> int:
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        try:
            size = int(raw)
        except ValueError:
            size = 0
        if not 1 <= size <= self.max_page_size:
            raise exceptions.ValidationError({self.page_size_query_param: [
                f"A whole number from 1 to {self.max_page_size} is required."]})
        return size

    def get_page_number(self, request: Any, paginator: Any) -> Any:
        number = request.query_params.get(self.page_query_param)
        if number == "":
            raise exceptions.NotFound("Invalid page: a page number is required.")
        return super().get_page_number(request, paginator)

    def get_schema_operation_parameters(self, view: Any) -> list[dict]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"].update(minimum=1, maximum=self.max_page_size)
            if parameter["name"] == self.page_query_param:
                parameter["schema"].update(minimum=1)
        return parameters


#: How deep a request body may nest. Python's decoder gives up somewhere past ~1,000 levels
#: on 3.11/3.12 and much later on 3.13; a fixed limit makes the answer the same everywhere.
MAX_BODY_DEPTH = 200


def _too_deep(value: Any, limit: int) -> bool:
    """Whether a decoded body nests deeper than ``limit`` (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        elif not isinstance(item, list):
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in item)
    return False


class JSONBodyParser(JSONParser):
    """DRF's JSON parser, with a body nested deeper than ``MAX_BODY_DEPTH`` (or too deep for
    Python's decoder, a ``RecursionError``) refused as a 400 like any other malformed JSON."""

    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            data = None
            too_deep = True
        else:
            too_deep = _too_deep(data, MAX_BODY_DEPTH)
        if too_deep:
            raise exceptions.ParseError("JSON parse error - the body is nested too deeply.",
                                        code="parse_error")
        return data


class JobGuardAPIView:
    """Mixin for every endpoint: permissions from settings, JSON only, one error shape, and
    no input that nothing reads."""

    renderer_classes = [JSONRenderer]
    parser_classes = [JSONBodyParser]
    pagination_class = Pagination
    if AutoSchema is not None:
        schema = AutoSchema()
    model_permissions: dict[str, list[str]] = {}
    #: Handlers (viewset actions, or the HTTP methods of a plain view) that read a body or
    #: query parameters, each through a strict serializer. Any other request must come
    #: without them: a field sent where nothing reads it is a 400, not silently ignored.
    body_handlers: frozenset[str] = frozenset()
    query_handlers: frozenset[str] = frozenset()

    def get_permissions(self) -> list:
        return [permission() for permission in api_permission_classes()]

    def get_exception_handler(self):
        return exception_handler

    def get_authenticate_header(self, request: Any) -> str | None:
        """The first challenge any authentication class offers (DRF asks only the first), so
        an anonymous request gets 401 with ``WWW-Authenticate`` under DRF's default Session +
        Basic authentication, and 403 only when no configured class can challenge."""
        for authenticator in self.get_authenticators():
            header = authenticator.authenticate_header(request)
            if header:
                return header
        return None

    def initial(self, request: Any, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        self.refuse_unread_input(request)

    def refuse_unread_input(self, request: Any) -> None:
        """400 ``unknown_field`` for query parameters or body fields sent to a handler that
        reads none (after authentication; a method with no handler stays a 405 or 404)."""
        method = request.method.lower()
        if method == "options" or getattr(self, method, None) is None:
            return
        handler = getattr(self, "action", None) or ("get" if method == "head" else method)
        if handler not in self.query_handlers:
            _query(s.NoQuerySerializer, request)
        if method not in ("get", "head") and handler not in self.body_handlers:
            form = _form_body(request)
            if form is None:
                s.NoBodySerializer(data=request.data).is_valid(raise_exception=True)
            elif form:  # a form with fields or files where nothing reads a body
                raise exceptions.UnsupportedMediaType(request.content_type)


#: Form bodies that many HTTP clients send with a POST that has no data (Django's test client
#: an empty ``multipart/form-data``): accepted where an endpoint reads no body, if empty.
FORM_MEDIA_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")


def _form_body(request: Any) -> bool | None:
    """``None`` if the body is not a form; else whether the form has any field or file."""
    if request.content_type.partition(";")[0].strip().lower() not in FORM_MEDIA_TYPES:
        return None
    try:
        return bool(request._request.POST or request._request.FILES)
    except Exception:  # a malformed form: refused as a body that is not JSON
        return True


def _query(serializer_class: type, request: Any) -> dict:
    serializer = serializer_class(data=request.query_params,
                                  context={"also_accepted": _drf_query_params(request)})
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def _drf_query_params(request: Any) -> list[str]:
    """Query parameters DRF reads itself: ``?format=`` and, on a list, the paginator's."""
    names = [api_settings.URL_FORMAT_OVERRIDE]
    view = (getattr(request, "parser_context", None) or {}).get("view")
    lists = (isinstance(view, mixins.ListModelMixin)
             and getattr(view, "action", "list") == "list")
    if lists and view.paginator is not None:
        names += [view.paginator.page_query_param, view.paginator.page_size_query_param]
    return [name for name in names if name]


def _store(request: Any):
    return _store_named(_query(s.StoreQuerySerializer, request).get("store"))


def _store_named(alias: str | None):
    try:
        return operations.store_for(alias)
    except operations.UnknownStoreError as exc:
        raise exceptions.ValidationError({"store": [str(exc)]})


def _key(key: str) -> str:
    serializer = s.KeySerializer(data={"key": key})
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data["key"]


STORE_PARAM = [s.StoreQuerySerializer]
KEY_PARAMS = STORE_PARAM
if AutoSchema is not None:
    KEY_PARAMS = [s.StoreQuerySerializer, OpenApiParameter(
        "key", str, OpenApiParameter.PATH, required=True, pattern=s.KEY_PATTERN,
        description="The lock or throttle key, e.g. jobguard:overlap:demo.jobs.Charge:7.")]


# -- queued jobs -------------------------------------------------------------------------


class QueuedJobViewSet(JobGuardAPIView, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                       viewsets.GenericViewSet):
    """Jobs waiting, delayed or reserved. ``DELETE`` cancels a job no worker holds."""

    serializer_class = s.QueuedJobSerializer
    queryset = QueuedJob.objects.all()
    lookup_value_regex = "[^/]+"
    model_permissions = {"GET": ["view_queuedjob"], "DELETE": ["delete_queuedjob"],
                         "POST": ["change_queuedjob"]}
    action_permissions = {"delete_matching": {"POST": ["delete_queuedjob"]}}
    query_handlers = frozenset({"list", "delete_matching"})

    def get_queryset(self):
        qs = QueuedJob.objects.with_state().order_by("queue", "-priority", "available_at", "id")
        if self.action in self.query_handlers:
            qs = _query(s.JobFilterSerializer, self.request)["search"].apply(qs)
        return qs

    def get_serializer(self, *args, **kwargs):
        serializer = super().get_serializer(*args, **kwargs)
        if args and self.action in ("list", "retrieve"):  # the page judged at once
            rows = list(args[0]) if kwargs.get("many") else [args[0]]
            serializer.context["stale"] = operations.stale_reservations(rows)
        return serializer

    @extend_schema(parameters=[s.JobFilterSerializer], responses={
        200: s.QueuedJobSerializer(many=True), **_errors(*READ_ERRORS, 404)})
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    @extend_schema(responses={200: s.QueuedJobSerializer, **_errors(*ONE_ERRORS)})
    def retrieve(self, request, *args, **kwargs):
        return super().retrieve(request, *args, **kwargs)

    @extend_schema(responses={204: None, **_errors(*ONE_ERRORS, 409)})
    def destroy(self, request, *args, **kwargs):
        job = self.get_object()
        if operations.cancel([job], actor=request.user.get_username()).reserved:
            raise Conflict(f"Job {job.id} is reserved by worker {job.reserved_by or '?'}; it "
                           f"cannot be cancelled while it runs.", code="reserved")
        return Response(status=status.HTTP_204_NO_CONTENT)


    @extend_schema(request=None, responses={200: s.CancelledSerializer,
                                            **_errors(*ONE_ERRORS, 409)})
    @action(detail=True, methods=["post"])
    def cancel(self, request, *args, **kwargs):
        """Cancel a job: deleted if no worker holds it, else the running job is asked to
        stop (it ends as cancelled when it checks ``job.cancelled``)."""
        try:
            job_id = str(uuid.UUID(kwargs["pk"]))
        except ValueError:
            raise Http404(f"{kwargs['pk']!r} is not a job id.")
        try:
            result = operations.cancel_job(job_id, actor=request.user.get_username())
        except operations.JobNotQueuedError as exc:
            if exc.finished:
                raise Conflict(str(exc), code="not_queued")
            raise Http404(str(exc))
        return Response({"id": job_id, "result": result})

    @extend_schema(request=None, responses={200: s.RequeuedSerializer,
                                            **_errors(*ONE_ERRORS, 409)})
    @action(detail=True, methods=["post"])
    def requeue(self, request, *args, **kwargs):
        """Put a job reserved by a worker that is gone back on the queue now (409
        ``worker_alive`` if its worker lives, ``not_reserved`` if no worker holds it)."""
        try:
            operations.requeue_job(kwargs["pk"], actor=request.user.get_username())
        except operations.RequeueRefused as exc:
            if exc.code == "not_queued":
                raise Http404(str(exc))
            raise Conflict(str(exc), code=exc.code)
        return Response({"id": kwargs["pk"], "result": "requeued"})

    @extend_schema(operation_id="jobs_delete_matching", request=None,
                   parameters=[s.JobFilterSerializer],
                   responses={200: s.BulkDeletedSerializer, **_errors(400, 401, 403)})
    @action(detail=False, methods=["post"], url_path="delete", url_name="delete-matching")
    def delete_matching(self, request, *args, **kwargs):
        """Delete every queued job the filters match (no filter: all) that no worker holds,
        freeing unique locks, in batches of 500; reserved ones are counted in ``skipped``."""
        search = _query(s.JobFilterSerializer, request)["search"]
        result = operations.delete_matching(self.get_queryset(),
                                            actor=request.user.get_username(),
                                            description=search.describe())
        return Response({"deleted": result.done, "skipped": result.skipped})


# -- failed jobs -------------------------------------------------------------------------


class FailedJobViewSet(JobGuardAPIView, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                       viewsets.GenericViewSet):
    """Failed jobs: inspect, retry (one or all) and forget."""

    queryset = FailedJob.objects.all()
    lookup_value_regex = "[^/]+"
    model_permissions = {"GET": ["view_failedjob"], "POST": ["change_failedjob"],
                         "DELETE": ["delete_failedjob"]}
    action_permissions = {"forget_matching": {"POST": ["delete_failedjob"]}}
    query_handlers = frozenset({"list", "retry_matching", "forget_matching"})
    body_handlers = frozenset({"retry_all"})  # retry/ takes no body: a field sent is a 400

    def get_serializer_class(self):
        if self.action == "retrieve":
            return s.FailedJobDetailSerializer
        if self.action in ("retry", "retry_all"):
            return s.RetryAllSerializer
        return s.FailedJobSerializer

    def get_queryset(self):
        qs = FailedJob.objects.order_by("-failed_at", "id")
        if self.action in self.query_handlers:
            qs = _query(s.FailedJobFilterSerializer, self.request)["search"].apply(qs)
        return qs

    @extend_schema(parameters=[s.FailedJobFilterSerializer], responses={
        200: s.FailedJobSerializer(many=True), **_errors(*READ_ERRORS, 404)})
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    @extend_schema(responses={200: s.FailedJobDetailSerializer, **_errors(*ONE_ERRORS)})
    def retrieve(self, request, *args, **kwargs):
        return super().retrieve(request, *args, **kwargs)

    @extend_schema(responses={204: None, **_errors(*ONE_ERRORS)})
    def destroy(self, request, *args, **kwargs):
        failed = self.get_object()
        try:
            operations.forget([failed], actor=request.user.get_username())
        except operations.FailedJobNotFound as exc:  # forgotten or retried meanwhile
            raise Http404(str(exc))
        return Response(status=status.HTTP_204_NO_CONTENT)

    def _retry(self, failed: list[FailedJob] | None = None, *, queue: str | None = None
               ) -> Response:
        try:
            ids = operations.retry(failed, queue=queue, actor=self.request.user.get_username())
        except IntegrityError:
            raise Conflict("A queued job with the same id exists already.", code="duplicate")
        except operations.FailedJobNotFound as exc:  # retried or forgotten meanwhile
            raise Http404(str(exc))
        return Response({"retried": len(ids), "ids": ids})

    @extend_schema(request=None, responses={200: s.RetriedSerializer,
                                            **_errors(*ONE_ERRORS, 409)})
    @action(detail=True, methods=["post"])
    def retry(self, request, *args, **kwargs):
        """Queue the failed job again with fresh attempts."""
        return self._retry([self.get_object()])

    @extend_schema(request=s.RetryAllSerializer, responses={
        200: s.RetriedSerializer, **_errors(400, 401, 403, 409, 415)})
    @action(detail=False, methods=["post"], url_path="retry-all")
    def retry_all(self, request, *args, **kwargs):
        """Queue every failed job (or every one of ``queue``) again."""
        body = s.RetryAllSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return self._retry(queue=body.validated_data.get("queue"))

    @extend_schema(operation_id="failed_jobs_retry_matching", request=None,
                   parameters=[s.FailedJobFilterSerializer],
                   responses={200: s.BulkRetriedSerializer, **_errors(400, 401, 403)})
    @action(detail=False, methods=["post"], url_path="retry", url_name="retry-matching")
    def retry_matching(self, request, *args, **kwargs):
        """Queue again every failed job the filters match (the list's query parameters; no
        filter: all), in batches of 500; ids queued already are counted in ``skipped``."""
        search = _query(s.FailedJobFilterSerializer, request)["search"]
        result = operations.retry_matching(self.get_queryset(),
                                           actor=request.user.get_username(),
                                           description=search.describe())
        return Response({"retried": result.done, "skipped": result.skipped})

    @extend_schema(operation_id="failed_jobs_delete_matching", request=None,
                   parameters=[s.FailedJobFilterSerializer],
                   responses={200: s.BulkForgottenSerializer, **_errors(400, 401, 403)})
    @action(detail=False, methods=["post"], url_path="delete", url_name="delete-matching")
    def forget_matching(self, request, *args, **kwargs):
        """Forget (delete) every failed job the filters match (no filter: all), in batches
        of 500."""
        search = _query(s.FailedJobFilterSerializer, request)["search"]
        result = operations.forget_matching(self.get_queryset(),
                                            actor=request.user.get_username(),
                                            description=search.describe())
        return Response({"deleted": result.done})


# -- batches -----------------------------------------------------------------------------


class BatchViewSet(JobGuardAPIView, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                   viewsets.GenericViewSet):
    """Batches with their counts and progress, newest first; ``cancel`` skips the jobs not
    started yet."""

    queryset = Batch.objects.order_by("-created_at", "id")
    serializer_class = s.BatchSerializer
    model_permissions = {"GET": ["view_batch"], "POST": ["change_batch"]}

    @extend_schema(responses={200: s.BatchSerializer(many=True),
                              **_errors(*READ_ERRORS, 404)})
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    @extend_schema(responses={200: s.BatchSerializer, **_errors(*ONE_ERRORS)})
    def retrieve(self, request, *args, **kwargs):
        return super().retrieve(request, *args, **kwargs)

    @extend_schema(request=None, responses={200: s.BatchSerializer,
                                            **_errors(*ONE_ERRORS, 409)})
    @action(detail=True, methods=["post"])
    def cancel(self, request, *args, **kwargs):
        """Cancel the batch (409 if it is cancelled or finished already)."""
        row = self.get_object()
        if row.finished or not batches.cancel(row.id):
            raise Conflict(f"Batch {row.id} is {row.status}; there is nothing to cancel.",
                           code="not_running")
        row.refresh_from_db()
        return Response(s.BatchSerializer(row).data)


# -- locks and throttles -----------------------------------------------------------------


class LockListView(JobGuardAPIView, GenericAPIView):
    """Locks held in a store (expired ones too), each with a stale verdict, a keyed page at a
    time (``?cursor=`` from ``next``): a page costs the same with 100 locks or 100,000."""

    serializer_class = s.LockSerializer
    pagination_class = None  # a keyed page (SCAN in Redis), not page numbers
    model_permissions = {"GET": ["view_lock"]}
    query_handlers = frozenset({"get"})

    @extend_schema(operation_id="locks_list", parameters=[s.LockPageQuerySerializer],
                   responses={200: s.LockPageSerializer, **_errors(*READ_ERRORS, 404)})
    def get(self, request, *args, **kwargs):
        params = _query(s.LockPageQuerySerializer, request)
        store = _store_named(params.get("store"))
        try:
            page = operations.lock_page(store, kind=params.get("kind") or None,
                                        prefix=params.get("prefix", ""),
                                        cursor=params.get("cursor", ""),
                                        limit=params["page_size"])
        except ValueError as exc:  # a cursor of another store
            raise exceptions.ValidationError({"cursor": [str(exc)]})
        next_url = replace_query_param(request.build_absolute_uri(), "cursor",
                                       page.cursor) if page.cursor else None
        return Response({"next": next_url,
                         "results": s.LockSerializer(page.rows, many=True).data})


class LockDetailView(JobGuardAPIView, GenericAPIView):
    """One lock; ``DELETE`` force-releases it whoever holds it."""

    serializer_class = s.LockSerializer
    model_permissions = {"GET": ["view_lock"], "DELETE": ["change_lock"]}
    query_handlers = frozenset({"get", "delete"})

    def _find(self, store: Any, key: str) -> operations.LockRow:
        row = operations.inspect_lock(store, key)
        if row is None:
            raise Http404(f"No lock {key!r} is held in store {store.alias!r}.")
        return row

    @extend_schema(parameters=KEY_PARAMS, responses={200: s.LockSerializer,
                                                      **_errors(400, *ONE_ERRORS)})
    def get(self, request, key: str):
        key, store = _key(key), _store(request)
        return Response(s.LockSerializer(self._find(store, key)).data)

    @extend_schema(parameters=KEY_PARAMS, responses={204: None, **_errors(400, *ONE_ERRORS)})
    def delete(self, request, key: str):
        key, store = _key(key), _store(request)
        if not operations.force_release(store, key, actor=request.user.get_username()):
            raise Http404(f"No lock {key!r} is held in store {store.alias!r}.")
        return Response(status=status.HTTP_204_NO_CONTENT)


def _throttles(store: Any) -> list[operations.ThrottleRow]:
    try:
        return operations.inspect_throttles(store)
    except NotImplementedError:
        raise NotSupported(f"Store {store.alias!r} cannot list throttles.")


class ThrottleListView(JobGuardAPIView, ListAPIView):
    """Rate-limit windows and exception circuits in a store."""

    serializer_class = s.ThrottleSerializer
    model_permissions = {"GET": ["view_throttle"]}
    query_handlers = frozenset({"get"})

    def get_queryset(self):
        return _throttles(_store(self.request))

    @extend_schema(parameters=STORE_PARAM, responses={200: s.ThrottleSerializer(many=True),
                                                      **_errors(*READ_ERRORS, 404, 501)})
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)


class ThrottleDetailView(JobGuardAPIView, GenericAPIView):
    """One window or circuit; ``DELETE`` resets it."""

    serializer_class = s.ThrottleSerializer
    model_permissions = {"GET": ["view_throttle"], "DELETE": ["change_throttle"]}
    query_handlers = frozenset({"get", "delete"})

    @extend_schema(parameters=KEY_PARAMS, responses={200: s.ThrottleSerializer,
                                                      **_errors(400, *ONE_ERRORS, 501)})
    def get(self, request, key: str):
        key, store = _key(key), _store(request)
        for row in _throttles(store):
            if row.key == key:
                return Response(s.ThrottleSerializer(row).data)
        raise Http404(f"No throttle {key!r} in store {store.alias!r}.")

    @extend_schema(parameters=KEY_PARAMS, responses={204: None,
                                                      **_errors(400, *ONE_ERRORS, 501)})
    def delete(self, request, key: str):
        key, store = _key(key), _store(request)
        try:
            reset = operations.reset_throttle(store, key, actor=request.user.get_username())
        except NotImplementedError:
            raise NotSupported(f"Store {store.alias!r} cannot reset throttles.")
        if not reset:
            raise Http404(f"No throttle {key!r} in store {store.alias!r}.")
        return Response(status=status.HTTP_204_NO_CONTENT)


# -- paused queues -----------------------------------------------------------------------


class PausedQueueListView(JobGuardAPIView, ListAPIView):
    """The paused queues: workers claim none of their jobs until they are resumed."""

    serializer_class = s.PausedQueueSerializer
    model_permissions = {"GET": ["view_pausedqueue"]}

    def get_queryset(self):
        return operations.paused_queues()

    @extend_schema(responses={200: s.PausedQueueSerializer(many=True),
                              **_errors(*READ_ERRORS, 404)})
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)


def _queue_name(queue: str) -> str:
    try:
        return operations.check_queue_name(queue)
    except operations.QueueNameError as exc:
        raise exceptions.ValidationError({"queue": [str(exc)]})


class PauseQueueView(JobGuardAPIView, APIView):
    """Pause a queue (running jobs finish); 200 with ``paused: false`` if it was already."""

    model_permissions = {"POST": ["change_pausedqueue"]}
    body_handlers = frozenset({"post"})

    @extend_schema(request=s.PauseSerializer, responses={
        200: s.PausedQueueSerializer, **_errors(400, 401, 403, 409, 415)})
    def post(self, request, queue: str):
        name = _queue_name(queue)
        body = s.PauseSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            operations.pause(name, force=body.validated_data["force"],
                             actor=request.user.get_username())
        except operations.QueueNameError as exc:
            raise exceptions.ValidationError({"queue": [str(exc)]}, code="unknown_queue")
        row = next((r for r in operations.paused_queues() if r.queue == name), None)
        if row is None:
            raise Conflict(f"Queue {name!r} was resumed meanwhile.", code="resumed")
        return Response(s.PausedQueueSerializer(row).data)


class ResumeQueueView(JobGuardAPIView, APIView):
    """Resume a paused queue; 404 if it is not paused."""

    model_permissions = {"POST": ["change_pausedqueue"]}

    @extend_schema(request=None, responses={204: None, **_errors(*ONE_ERRORS)})
    def post(self, request, queue: str):
        name = _queue_name(queue)
        try:
            operations.resume(name, actor=request.user.get_username())
        except operations.QueueNameError as exc:
            raise Http404(str(exc))
        return Response(status=status.HTTP_204_NO_CONTENT)


# -- stats -------------------------------------------------------------------------------


class StatsView(JobGuardAPIView, APIView):
    """Per-queue counts and the jobs live workers finished in the last minute."""

    model_permissions = {"GET": ["view_queuedjob"]}

    @extend_schema(responses={200: s.StatsSerializer, **_errors(401, 403)})
    def get(self, request):
        return Response(s.StatsSerializer(operations.stats()).data)


class StatsHistoryView(StatsView):
    """What the admin's dashboard shows: per-queue counts (exact up to 10,000, then
    estimated on PostgreSQL), failures of the last hour, oldest waiting job, paused and
    unserved flags; live workers; locks and circuits per store; jobs/min done and failed per
    queue over the last hour (per minute) and the last 24 clock hours (per hour)."""

    @extend_schema(responses={200: s.StatsHistorySerializer, **_errors(401, 403)})
    def get(self, request):
        return Response(s.StatsHistorySerializer(monitoring.overview()).data)


# -- schedules ---------------------------------------------------------------------------


class ScheduleListView(JobGuardAPIView, APIView):
    """Periodic schedules with their last and next run (read only)."""

    model_permissions = {"GET": ["view_scheduletick"]}
    pagination_class = None  # schedules come from settings: a short list, not paginated

    @extend_schema(responses={200: s.ScheduleSerializer(many=True), **_errors(401, 403)})
    def get(self, request):
        return Response(s.ScheduleSerializer(schedules.schedule_status(), many=True).data)


# -- dispatch ----------------------------------------------------------------------------

_SIMPLE_TYPES = {int, float, str, bool, list, dict}


def _accepts(annotation: Any, value: Any) -> bool | None:
    """Whether ``value`` fits a plain annotation; ``None`` when the annotation is not one
    of int/float/str/bool/list/dict (optionally ``| None``), so it is not checked."""
    if annotation is None or annotation is type(None):
        return value is None
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        verdicts = [_accepts(arg, value) for arg in typing.get_args(annotation)]
        if None in verdicts:
            return None
        return any(verdicts)
    if origin in (list, dict):
        annotation = origin
    if annotation not in _SIMPLE_TYPES:
        return None
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, annotation)


def _signature(job_class: type[Job]) -> tuple[inspect.Signature, Any]:
    """The call signature a dispatch must match, and the callable it belongs to."""
    if issubclass(job_class, FunctionJob):
        return inspect.signature(job_class.func), job_class.func
    init = job_class.__init__
    signature = inspect.signature(init)
    return signature.replace(parameters=list(signature.parameters.values())[1:]), init


def check_arguments(job_class: type[Job], args: list, kwargs: dict) -> dict[str, list[str]]:
    """Field errors when ``args``/``kwargs`` do not fit the job's signature or plain
    annotations; empty when they do."""
    signature, target = _signature(job_class)
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        return {"kwargs" if kwargs else "args": [f"{job_class.name}: {exc}."]}
    try:
        hints = typing.get_type_hints(target)
    except Exception:  # unresolvable annotations: the signature check is all we can do
        hints = {}
    errors: dict[str, list[str]] = {}
    positional = {name: i for i, name in enumerate(signature.parameters)}
    for name, value in bound.arguments.items():
        param = signature.parameters[name]
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) or name not in hints:
            continue
        if _accepts(hints[name], value) is False:
            field = "kwargs" if name in kwargs else "args"
            where = name if field == "kwargs" else f"args[{positional[name]}] ({name})"
            expected = getattr(hints[name], "__name__", str(hints[name]))
            errors.setdefault(field, []).append(
                f"{where} must be {expected}, not {type(value).__name__}.")
    return errors


class DispatchView(JobGuardAPIView, APIView):
    """Queue a job by name. Only names in ``JOBGUARD['API_DISPATCHABLE_JOBS']`` are accepted."""

    model_permissions = {"POST": ["add_queuedjob"]}
    body_handlers = frozenset({"post"})

    @extend_schema(request=s.DispatchSerializer, responses={
        201: s.DispatchedSerializer,
        200: OpenApiResponse(s.SkippedSerializer, description="A unique job's copy is queued.")
        if AutoSchema else s.SkippedSerializer,
        **_errors(400, 401, 403, 415)})
    def post(self, request):
        body = s.DispatchSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        name = data["job"]
        # The allowlist first, with one answer for an unknown name and a registered one that
        # is not listed: a caller cannot probe which job names exist.
        if name not in jobguard_settings.API_DISPATCHABLE_JOBS:
            raise exceptions.PermissionDenied(
                f"Job {name!r} is not dispatchable over HTTP: "
                f"JOBGUARD['API_DISPATCHABLE_JOBS'] does not list it.", code="not_dispatchable")
        try:
            job_class = registry.get(name)
        except registry.UnknownJobError as exc:  # listed but not registered (jobguard.E005)
            raise exceptions.ValidationError({"job": [str(exc)]})
        args, kwargs = data["args"], data["kwargs"]
        for field, values in (("args", args), ("kwargs", kwargs)):
            try:  # JSON input is plain data; this catches reserved keys such as __jobguard__
                serialization.encode(values, path=field)
            except (TypeError, ValueError) as exc:  # and NUL, lone surrogates
                raise exceptions.ValidationError({field: [str(exc)]})
        errors = check_arguments(job_class, args, kwargs)
        if errors:
            raise exceptions.ValidationError(errors)
        try:
            job = job_class(*args, **kwargs)
            dispatched = job.dispatch(delay=data.get("delay"), queue=data.get("queue"),
                                      priority=data.get("priority"))
        except (TypeError, ValueError) as exc:
            raise exceptions.ValidationError({"non_field_errors": [str(exc)]})
        if not dispatched:
            return Response({"skipped": dispatched.skipped, "job": name},
                            status=status.HTTP_200_OK)
        return Response({"id": dispatched.id, "job": name, "queue": dispatched.queue},
                        status=status.HTTP_201_CREATED)


class NotFoundView(JobGuardAPIView, APIView):
    """Any other path under the API: a JSON 404 like every other error here."""

    # No data behind it: any caller the permission classes let in gets the 404.
    model_permissions = {method: [] for method in ("GET", "POST", "PUT", "PATCH", "DELETE")}

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        raise Http404("No such endpoint.")


# -- the schema --------------------------------------------------------------------------

if AutoSchema is not None:
    from drf_spectacular.renderers import OpenApiJsonRenderer, OpenApiYamlRenderer
    from drf_spectacular.views import SpectacularAPIView

    class SchemaView(JobGuardAPIView, SpectacularAPIView):
        """The OpenAPI 3 document of this API, with paths under wherever it is mounted."""

        renderer_classes = [OpenApiJsonRenderer, OpenApiYamlRenderer]
        model_permissions = {"GET": ["view_queuedjob"]}
        query_handlers = frozenset({"get"})  # drf-spectacular's ?format=, ?lang=, ?version=
        custom_settings = {
            "TITLE": "django-jobguard API",
            "DESCRIPTION": "Queued and failed jobs, locks, throttles, stats and dispatch.",
            "VERSION": "1",
        }

        #: The API's URL patterns, given by ``urls.py`` (``as_view(endpoint_patterns=...)``).
        endpoint_patterns: list = []

        @extend_schema(exclude=True)
        def get(self, request, *args, **kwargs):
            from django.urls import include, path

            route = getattr(request.resolver_match, "route", "") or request.path.lstrip("/")
            prefix = route[: -len("schema/")] if route.endswith("schema/") else ""
            self.patterns = [path(prefix, include(self.endpoint_patterns))]
            return super().get(request, *args, **kwargs)
else:  # pragma: no cover - drf-spectacular not installed
    SchemaView = None
