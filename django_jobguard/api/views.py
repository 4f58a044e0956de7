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
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param
from rest_framework.views import APIView

from django_jobguard import history, operations, registry, schedules, serialization, slo
from django_jobguard import tags as job_tags
from django_jobguard.api import serializers as s
from django_jobguard.api.base import (
    KEY_PARAMS,
    ONE_ERRORS,
    READ_ERRORS,
    STORE_PARAM,
    AutoSchema,
    Conflict,
    JobGuardAPIView,
    NotSupported,
    OpenApiResponse,
    error_responses,
    extend_schema,
    read_query,
    request_store,
    store_named,
    valid_key,
)
from django_jobguard.conf import jobguard_settings
from django_jobguard.decorators import FunctionJob
from django_jobguard.jobs import Job
from django_jobguard.models import (
    Batch,
    FailedJob,
    FinishedRun,
    QueuedJob,
    Worker,
    may_view_arguments,
)
from django_jobguard.operations import monitoring
from django_jobguard.workflows import batches


def searched(request: Any, search: operations.JobSearch) -> operations.JobSearch:
    """``search``, unless it looks inside arguments and the user may not see them
    (``view_job_arguments``): then a 403 saying so (the search would reveal them)."""
    refuse_argument_search(request, bool(search.arguments))
    return search


def refuse_argument_search(request: Any, by_arguments: bool) -> None:
    if by_arguments and not may_view_arguments(request.user):
        raise exceptions.PermissionDenied(
            "Searching by arguments needs the view_job_arguments permission.",
            code="permission_denied")


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
            qs = searched(self.request, read_query(s.JobFilterSerializer, self.request)[
                "search"]).apply(qs)
        return qs

    def get_serializer(self, *args, **kwargs):
        serializer = super().get_serializer(*args, **kwargs)
        if args and self.action in ("list", "retrieve"):  # the page judged at once
            rows = list(args[0]) if kwargs.get("many") else [args[0]]
            serializer.context["stale"] = operations.stale_reservations(rows)
        return serializer

    @extend_schema(parameters=[s.JobFilterSerializer], responses={
        200: s.QueuedJobSerializer(many=True), **error_responses(*READ_ERRORS, 404)})
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    @extend_schema(responses={200: s.QueuedJobSerializer, **error_responses(*ONE_ERRORS)})
    def retrieve(self, request, *args, **kwargs):
        return super().retrieve(request, *args, **kwargs)

    @extend_schema(responses={204: None, **error_responses(*ONE_ERRORS, 409)})
    def destroy(self, request, *args, **kwargs):
        job = self.get_object()
        if operations.cancel([job], actor=request.user.get_username()).reserved:
            raise Conflict(f"Job {job.id} is reserved by worker {job.reserved_by or '?'}; it "
                           f"cannot be cancelled while it runs.", code="reserved")
        return Response(status=status.HTTP_204_NO_CONTENT)


    @extend_schema(request=None, responses={200: s.CancelledSerializer,
                                            **error_responses(*ONE_ERRORS, 409)})
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
                                            **error_responses(*ONE_ERRORS, 409)})
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
                   responses={200: s.BulkDeletedSerializer, **error_responses(400, 401, 403)})
    @action(detail=False, methods=["post"], url_path="delete", url_name="delete-matching")
    def delete_matching(self, request, *args, **kwargs):
        """Delete every queued job the filters match (no filter: all) that no worker holds,
        freeing unique locks, in batches of 500; reserved ones are counted in ``skipped``."""
        search = searched(request, read_query(s.JobFilterSerializer, request)["search"])
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
            qs = searched(self.request, read_query(s.FailedJobFilterSerializer, self.request)[
                "search"]).apply(qs)
        return qs

    @extend_schema(parameters=[s.FailedJobFilterSerializer], responses={
        200: s.FailedJobSerializer(many=True), **error_responses(*READ_ERRORS, 404)})
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    @extend_schema(responses={200: s.FailedJobDetailSerializer, **error_responses(*ONE_ERRORS)})
    def retrieve(self, request, *args, **kwargs):
        return super().retrieve(request, *args, **kwargs)

    @extend_schema(responses={204: None, **error_responses(*ONE_ERRORS)})
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
                                            **error_responses(*ONE_ERRORS, 409)})
    @action(detail=True, methods=["post"])
    def retry(self, request, *args, **kwargs):
        """Queue the failed job again with fresh attempts."""
        return self._retry([self.get_object()])

    @extend_schema(request=s.RetryAllSerializer, responses={
        200: s.RetriedSerializer, **error_responses(400, 401, 403, 409, 415)})
    @action(detail=False, methods=["post"], url_path="retry-all")
    def retry_all(self, request, *args, **kwargs):
        """Queue every failed job (or every one of ``queue``) again."""
        body = s.RetryAllSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return self._retry(queue=body.validated_data.get("queue"))

    @extend_schema(operation_id="failed_jobs_retry_matching", request=None,
                   parameters=[s.FailedJobFilterSerializer],
                   responses={200: s.BulkRetriedSerializer, **error_responses(400, 401, 403)})
    @action(detail=False, methods=["post"], url_path="retry", url_name="retry-matching")
    def retry_matching(self, request, *args, **kwargs):
        """Queue again every failed job the filters match (the list's query parameters; no
        filter: all), in batches of 500; ids queued already are counted in ``skipped``."""
        search = searched(request, read_query(s.FailedJobFilterSerializer, request)["search"])
        result = operations.retry_matching(self.get_queryset(),
                                           actor=request.user.get_username(),
                                           description=search.describe())
        return Response({"retried": result.done, "skipped": result.skipped})

    @extend_schema(operation_id="failed_jobs_delete_matching", request=None,
                   parameters=[s.FailedJobFilterSerializer],
                   responses={200: s.BulkForgottenSerializer, **error_responses(400, 401, 403)})
    @action(detail=False, methods=["post"], url_path="delete", url_name="delete-matching")
    def forget_matching(self, request, *args, **kwargs):
        """Forget (delete) every failed job the filters match (no filter: all), in batches
        of 500."""
        search = searched(request, read_query(s.FailedJobFilterSerializer, request)["search"])
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
                              **error_responses(*READ_ERRORS, 404)})
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    @extend_schema(responses={200: s.BatchSerializer, **error_responses(*ONE_ERRORS)})
    def retrieve(self, request, *args, **kwargs):
        return super().retrieve(request, *args, **kwargs)

    @extend_schema(request=None, responses={200: s.BatchSerializer,
                                            **error_responses(*ONE_ERRORS, 409)})
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
                   responses={200: s.LockPageSerializer,
                              **error_responses(*READ_ERRORS, 404, 503)})
    def get(self, request, *args, **kwargs):
        params = read_query(s.LockPageQuerySerializer, request)
        store = store_named(params.get("store"))
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
                                                      **error_responses(*ONE_ERRORS, 503)})
    def get(self, request, key: str):
        key, store = valid_key(key), request_store(request)
        return Response(s.LockSerializer(self._find(store, key)).data)

    @extend_schema(parameters=KEY_PARAMS,
                   responses={204: None, **error_responses(*ONE_ERRORS, 503)})
    def delete(self, request, key: str):
        key, store = valid_key(key), request_store(request)
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
        return _throttles(request_store(self.request))

    @extend_schema(parameters=STORE_PARAM, responses={
        200: s.ThrottleSerializer(many=True), **error_responses(*READ_ERRORS, 404, 501, 503)})
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)


class ThrottleDetailView(JobGuardAPIView, GenericAPIView):
    """One window or circuit; ``DELETE`` resets it."""

    serializer_class = s.ThrottleSerializer
    model_permissions = {"GET": ["view_throttle"], "DELETE": ["change_throttle"]}
    query_handlers = frozenset({"get", "delete"})

    @extend_schema(parameters=KEY_PARAMS, responses={200: s.ThrottleSerializer,
                                                      **error_responses(*ONE_ERRORS, 501, 503)})
    def get(self, request, key: str):
        key, store = valid_key(key), request_store(request)
        for row in _throttles(store):
            if row.key == key:
                return Response(s.ThrottleSerializer(row).data)
        raise Http404(f"No throttle {key!r} in store {store.alias!r}.")

    @extend_schema(parameters=KEY_PARAMS, responses={204: None,
                                                      **error_responses(*ONE_ERRORS, 501, 503)})
    def delete(self, request, key: str):
        key, store = valid_key(key), request_store(request)
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
                              **error_responses(*READ_ERRORS, 404)})
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
        200: s.PausedQueueSerializer, **error_responses(400, 401, 403, 409, 415)})
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

    @extend_schema(request=None, responses={204: None, **error_responses(*ONE_ERRORS)})
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

    @extend_schema(responses={200: s.StatsSerializer, **error_responses(401, 403)})
    def get(self, request):
        return Response(s.StatsSerializer(operations.stats()).data)


class StatsHistoryView(StatsView):
    """What the admin's dashboard shows: per-queue counts (exact up to 10,000, then
    estimated on PostgreSQL), failures of the last hour, oldest waiting job, paused and
    unserved flags, breached objectives and the recommended worker count; live workers; locks
    and circuits per store; jobs/min done and failed per queue over the last hour (per
    minute) and the last 24 clock hours (per hour)."""

    @extend_schema(responses={200: s.StatsHistorySerializer, **error_responses(401, 403)})
    def get(self, request):
        data = monitoring.overview()
        loads = slo.measure(counts=data["queues"])
        for name, counts in data["queues"].items():
            load = loads.get(name)
            counts["breached"] = list(load.breached) if load else []
            counts["recommended_workers"] = load.recommended_workers if load else 0
        return Response(s.StatsHistorySerializer(data).data)


# -- finished runs (history) -------------------------------------------------------------


class FinishedRunViewSet(JobGuardAPIView, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                         viewsets.GenericViewSet):
    """Finished runs (``JOBGUARD["HISTORY"]``), newest first, read only; ``statistics``: runs,
    failures and runtime/wait percentiles per job class and queue."""

    queryset = FinishedRun.objects.all()
    serializer_class = s.FinishedRunSerializer
    model_permissions = {"GET": ["view_finishedrun"]}
    query_handlers = frozenset({"list", "statistics"})

    def get_queryset(self):
        qs = FinishedRun.objects.order_by("-finished_at", "-id")
        if self.action != "list":
            return qs
        query = read_query(s.FinishedRunFilterSerializer, self.request)
        refuse_argument_search(self.request, bool(query.get("lookups") or "arguments" in query))
        for field in ("name", "queue", "state"):
            if field in query:
                qs = qs.filter(**{field: query[field]})
        if "arguments" in query:
            qs = qs.filter(arguments__icontains=query["arguments"])
        if query.get("tag"):
            qs = qs.filter(job_tags.lookup(query["tag"]))
        qs = operations.search.filter_arguments(qs, query.get("lookups", ()), field="arguments")
        if "since" in query:
            qs = qs.filter(finished_at__gte=query["since"])
        if "until" in query:
            qs = qs.filter(finished_at__lt=query["until"])
        return qs

    @extend_schema(parameters=[s.FinishedRunFilterSerializer], responses={
        200: s.FinishedRunSerializer(many=True), **error_responses(*READ_ERRORS, 404)})
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    @extend_schema(responses={200: s.FinishedRunSerializer, **error_responses(*ONE_ERRORS)})
    def retrieve(self, request, *args, **kwargs):
        return super().retrieve(request, *args, **kwargs)

    @extend_schema(parameters=[s.RunStatisticsQuerySerializer], responses={
        200: s.RunStatisticsSerializer, **error_responses(*READ_ERRORS)})
    @action(detail=False, methods=["get"], pagination_class=None)
    def statistics(self, request, *args, **kwargs):
        """Per job class and queue over ``window`` (1h, 24h, 7d): runs, failures,
        p50/p95/max runtime and wait in seconds, slowest p95 first."""
        window = read_query(s.RunStatisticsQuerySerializer, request)["window"] or "24h"
        return Response(s.RunStatisticsSerializer(
            {"window": window, "classes": history.run_statistics(window)}).data)


# -- workers -----------------------------------------------------------------------------


class WorkerViewSet(JobGuardAPIView, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                    viewsets.GenericViewSet):
    """Workers with their verdict and the jobs they run; ``quiet`` (claim nothing new, the
    running jobs finish) and ``stop`` (a graceful stop), delivered through the worker's row
    within one heartbeat, to a live worker only."""

    queryset = Worker.objects.all()
    serializer_class = s.WorkerSerializer
    lookup_value_regex = "[^/]+"
    model_permissions = {"GET": ["view_worker"]}
    action_permissions = {"quiet": {"POST": ["quiet_worker"]},
                          "stop": {"POST": ["stop_worker"]}}

    def get_queryset(self):
        return Worker.objects.order_by("-last_seen_at", "id")

    def get_serializer(self, *args, **kwargs):
        serializer = super().get_serializer(*args, **kwargs)
        if args and self.action in ("list", "retrieve"):  # the page judged at once
            rows = list(args[0]) if kwargs.get("many") else [args[0]]
            serializer.context["worker_states"] = operations.worker_states(
                [row.id for row in rows])
            serializer.context["running_jobs"] = operations.running_jobs(rows)
        return serializer

    @extend_schema(responses={200: s.WorkerSerializer(many=True),
                              **error_responses(*READ_ERRORS, 404)})
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    @extend_schema(responses={200: s.WorkerSerializer, **error_responses(*ONE_ERRORS)})
    def retrieve(self, request, *args, **kwargs):
        return super().retrieve(request, *args, **kwargs)

    def _command(self, request: Any, worker_id: str, command: str) -> Response:
        try:
            now = operations.command_worker(worker_id, command,
                                            actor=request.user.get_username())
        except operations.WorkerNotFound as exc:
            raise Http404(str(exc))
        except operations.WorkerGoneError as exc:
            raise Conflict(str(exc), code="worker_gone")
        return Response({"id": worker_id, "command": now})

    @extend_schema(request=None, responses={200: s.WorkerCommandedSerializer,
                                            **error_responses(*ONE_ERRORS, 409)})
    @action(detail=True, methods=["post"])
    def quiet(self, request, *args, **kwargs):
        """Quiet a live worker: it claims nothing new from its next heartbeat, its running
        jobs finish (``job.stopping`` is true in them), it stays up until stopped (409
        ``worker_gone`` if it is not alive)."""
        return self._command(request, kwargs["pk"], "quiet")

    @extend_schema(request=None, responses={200: s.WorkerCommandedSerializer,
                                            **error_responses(*ONE_ERRORS, 409)})
    @action(detail=True, methods=["post"])
    def stop(self, request, *args, **kwargs):
        """Stop a live worker gracefully: from its next heartbeat it claims nothing new, its
        running jobs finish, and it exits 0 (as on SIGTERM; ``--stop-timeout`` applies)."""
        return self._command(request, kwargs["pk"], "stop")


# -- schedules ---------------------------------------------------------------------------


class ScheduleListView(JobGuardAPIView, APIView):
    """Periodic schedules with their last and next run (read only)."""

    model_permissions = {"GET": ["view_scheduletick"]}
    pagination_class = None  # schedules come from settings: a short list, not paginated

    @extend_schema(responses={200: s.ScheduleSerializer(many=True), **error_responses(401, 403)})
    def get(self, request):
        return Response(s.ScheduleSerializer(schedules.schedule_status(), many=True).data)


class RunScheduleView(JobGuardAPIView, APIView):
    """Run a schedule's job once now, outside its ticks (the next tick runs as planned)."""

    model_permissions = {"POST": ["run_schedule"]}

    @extend_schema(request=None, responses={
        201: s.ScheduleRunSerializer,
        200: OpenApiResponse(s.SkippedSerializer, description="A unique job's copy is queued.")
        if AutoSchema else s.SkippedSerializer,
        **error_responses(*ONE_ERRORS, 503)})
    def post(self, request, name: str):
        try:
            result = schedules.run_now(name, actor=request.user.get_username())
        except schedules.UnknownScheduleError as exc:
            raise Http404(str(exc))
        except schedules.ScheduleError as exc:  # its job is not registered (E061)
            raise exceptions.ValidationError({"schedule": [str(exc)]})
        if not result:
            return Response({"skipped": result.skipped, "job": result.job_name},
                            status=status.HTTP_200_OK)
        return Response({"id": result.id, "job": result.job_name, "queue": result.queue,
                         "schedule": name}, status=status.HTTP_201_CREATED)


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
        **error_responses(400, 401, 403, 415, 503)})
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
                                      priority=data.get("priority"), tags=data["tags"])
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
