"""The Django admin for jobguard: queued and failed jobs, locks, throttles and workers.

Queued and failed jobs are ordinary model admins (read-only detail pages, actions for what
operators do). Locks and throttles may live in Redis, so their pages are views over the store
API (``Store.locks()`` / ``Store.throttles()``), registered on the ``Lock`` and ``Throttle``
models only to get a place in the admin, the model permissions and the URL names.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import mark_safe
from django.utils.text import Truncator
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from django_jobguard import operations, registry, schedules
from django_jobguard.admin.dashboard import DashboardAdmin
from django_jobguard.models import (
    Batch,
    Chain,
    Dashboard,
    FailedJob,
    JobResult,
    Lock,
    PausedQueue,
    QueuedJob,
    ScheduleTick,
    Throttle,
    Worker,
)
from django_jobguard.progress import stored_fraction
from django_jobguard.workflows import batches

logger = logging.getLogger("django_jobguard.admin")

admin.site.register(Dashboard, DashboardAdmin)  # the dashboard page, first in the section


def _seconds_label(seconds: float | None, *, none: str) -> str:
    """``never`` / ``42 s`` / ``3 min 5 s`` / ``2 h 10 min`` / ``expired 4 s ago``."""
    if seconds is None:
        return none
    if seconds <= 0:
        return f"expired {_duration(-seconds)} ago"
    return _duration(seconds)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def _pretty_error(text: str) -> str:
    """A stored error: its ``Class: message`` line and traceback, as preformatted text."""
    return format_html('<pre class="jobguard-traceback">{}</pre>', text) if text else "-"


def _pretty_json(value: Any) -> str:
    return format_html('<pre class="jobguard-json">{}</pre>',
                       json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))


def _context_pretty(self: Any, obj: Any) -> str:
    """The context the job was dispatched in (carriers: language, correlation id, tenant...),
    one ``name: value`` line each; "-" when it carries none."""
    context = obj.payload.get("context") if isinstance(obj.payload, dict) else None
    if not isinstance(context, dict) or not context:
        return "-"
    lines = (f"{name}: {value if isinstance(value, str) else json.dumps(value)}"
             for name, value in sorted(context.items()))
    return format_html('<pre class="jobguard-context">{}</pre>', "\n".join(lines))


def _timestamp(field: str, label: Any) -> Any:
    """A list column showing ``field`` to the second, in the current time zone (Django's
    default format leaves seconds out, and jobs move by the second)."""

    @admin.display(description=label, ordering=field)
    def column(self: Any, obj: Any) -> str:
        value = getattr(obj, field)
        return timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S") if value else "-"

    return column


def _breakable(name: str) -> str:
    """A dotted name that may wrap after each dot (long job paths in a narrow column)."""
    return format_html_join(mark_safe(".<wbr>"), "{}", ((part,) for part in name.split(".")))


#: Rows named on a confirmation page (the count covers them all).
CONFIRM_SAMPLE = 10

#: The search box also takes argument lookups: ``kwargs__invoice_id=7 args__0="abc"``.
_SEARCH_TOKEN = re.compile(r'(?:[^\s"]+|"(?:\\.|[^"\\])*")+')


def _split_search(term: str) -> tuple[list[tuple[str, str]], str]:
    """``(argument lookups, the rest of the search)`` from the search box's text."""
    lookups, rest = [], []
    for token in _SEARCH_TOKEN.findall(term or ""):
        name, sep, value = token.partition("=")
        if sep and operations.search.is_argument_param(name):
            lookups.append((name, value))
        else:
            rest.append(token)
    return lookups, " ".join(rest)


class JobSearchAdminMixin:
    """The queued and failed job lists: names shown (and filtered) as operators know them
    (a django.tasks task's own name), the search box taking argument lookups, and bulk
    actions over everything the list matches, confirmed with a count first."""

    search_help_text = _('Ids, names, or arguments as JSON: kwargs__invoice_id=7 args__0="abc"')

    class Media:
        css = {"all": ["django_jobguard/admin-lists.css"]}

    @admin.display(description=_("job name"), ordering="name")
    def name_display(self, obj: Any) -> str:
        return _breakable(registry.display_name(obj.name, obj.payload))

    def get_search_results(self, request: HttpRequest, queryset: Any, search_term: str):
        lookups, rest = _split_search(search_term)
        if lookups:
            try:
                queryset = operations.JobSearch(
                    arguments=operations.search.parse_arguments(lookups)).apply(queryset)
            except operations.SearchError as exc:
                if not getattr(request, "_jobguard_search_error", False):
                    request._jobguard_search_error = True
                    self.message_user(request, _("Search: %(error)s") % {"error": exc.message},
                                      messages.ERROR)
                return queryset.none(), False
        narrowed = queryset  # the list's filters (and argument lookups) applied
        queryset, duplicates = super().get_search_results(request, queryset, rest)
        if rest:  # the names operators see: a django.tasks task's own dotted name
            for adapter, keys in registry.display_paths().items():
                queryset |= narrowed.filter(name=adapter, **{
                    "payload__" + "__".join(keys) + "__icontains": rest})
        return queryset, duplicates

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None):
        queue = request.GET.get("queue")
        if queue and request.method == "GET":  # a typo must not look like an empty queue
            try:
                operations.search.check_queue(queue)
            except operations.SearchError as exc:
                self.message_user(request, exc.message, messages.WARNING)
        return super().changelist_view(request, extra_context)

    def confirm(self, request: HttpRequest, queryset: Any, *, title: str, question: str,
                button: str, notes: list[str] | None = None,
                count: int | None = None) -> TemplateResponse | None:
        """The confirmation page of a bulk action (None once it was confirmed): how many
        jobs, the search, and the first few of them. With "select all", ``queryset`` is
        everything the list matches; nothing is loaded but the count and the sample."""
        if request.POST.get("post") == "yes":
            return None
        if count is None:
            count = queryset.count()
        sample = [f"{registry.display_name(row.name, row.payload)} [{row.id}]"
                  for row in queryset.order_by("id")[:CONFIRM_SAMPLE]]
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts, "title": title, "question": question, "button": button,
            "notes": notes or [], "count": count, "sample": sample,
            "search": request.GET.get("q", "") or "",
            "action": request.POST.get("action", ""),
            "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
            "select_across": request.POST.get("select_across") in ("1", "True", "true"),
            "media": self.media,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/django_jobguard/bulk_confirmation.html",
                                context)


class ReadOnlyDetailMixin:
    """Rows are written by workers, not by hand: no add form, detail pages are read-only
    (object-level change permission is off), while list actions still need change."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None:
            return False
        return super().has_change_permission(request, obj)


class StateFilter(admin.SimpleListFilter):
    title = _("state")
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return [(state, _(state)) for state in operations.STATES]

    def queryset(self, request, queryset):
        if self.value() in operations.STATES:
            return queryset.in_state(self.value())
        return queryset


class JobNameFilter(admin.SimpleListFilter):
    """Job names as operators know them: a django.tasks task by its own dotted name."""

    title = _("job name")
    parameter_name = "name"
    result = False

    def lookups(self, request, model_admin):
        rows = model_admin.model._default_manager.using(model_admin.get_queryset(request).db)
        paths = registry.display_paths(result=self.result)
        names = set(rows.exclude(name__in=list(paths)).values_list("name", flat=True)
                    .distinct().order_by())
        for adapter, keys in paths.items():
            names.update(value for value in rows.filter(name=adapter).values_list(
                "payload__" + "__".join(keys), flat=True).distinct().order_by()
                if isinstance(value, str))
        return [(name, name) for name in sorted(names)]

    def queryset(self, request, queryset):
        if self.value():
            return queryset.filter(operations.name_q(self.value(), result=self.result))
        return queryset


@admin.register(QueuedJob)
class QueuedJobAdmin(JobSearchAdminMixin, ReadOnlyDetailMixin, admin.ModelAdmin):
    # Fits at 1280 px beside the admin's navigation: the id is in each row's link and in the
    # search, not a column of its own.
    list_display = ["name_display", "queue", "state_display", "attempts", "priority",
                    "available_at_display"]
    list_filter = ["queue", StateFilter, JobNameFilter]
    search_fields = ["id", "name"]
    ordering = ["queue", "-priority", "available_at"]
    actions = ["run_now", "requeue", "cancel", "delete_selected"]
    fields = ["id", "name", "queue", "state_display", "progress_display", "attempts",
              "exceptions", "priority", "available_at", "reserved_at", "reserved_by",
              "created_at", "wait_reason", "cancel_requested_at", "last_error_pretty",
              "context_pretty", "payload_pretty"]
    readonly_fields = fields
    list_per_page = 50

    available_at_display = _timestamp("available_at", _("available at"))

    def get_queryset(self, request):
        return super().get_queryset(request).with_state()

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None):
        response = super().changelist_view(request, extra_context)
        cl = getattr(response, "context_data", {}).get("cl") if hasattr(
            response, "context_data") else None
        if cl is not None:  # the page's reservations judged at once (one worker query)
            stale = operations.stale_reservations(cl.result_list, using=cl.queryset.db)
            for row in cl.result_list:
                row.jobguard_stale = stale.get(str(row.id), "")
        return response

    @admin.display(description=_("state"), ordering="jobguard_state")
    def state_display(self, obj: QueuedJob) -> str:
        state = obj.state  # the annotation of get_queryset(): database clock
        if state == "reserved":
            since = timezone.localtime(obj.reserved_at).strftime("%Y-%m-%d %H:%M:%S")
            stale = getattr(obj, "jobguard_stale", None)
            if stale is None:  # the detail page: this row alone
                stale = operations.stale_reservations([obj]).get(str(obj.id), "")
            # A running job's progress shows here (one column less in the list).
            progress = format_html("<br>{}", self.progress_display(obj)) \
                if obj.progress is not None else ""
            cancel = format_html(", <strong>{}</strong>", _("cancel requested")) \
                if obj.cancel_requested_at is not None else ""
            flag = format_html(', <strong class="jobguard-stale" title="{}">stale: {}</strong>',
                               stale, stale) if stale else ""
            return format_html("reserved by <code>{}</code> since {}{}{}{}", obj.reserved_by,
                               since, cancel, flag, progress)
        if state == "delayed":
            until = timezone.localtime(obj.available_at).strftime("%Y-%m-%d %H:%M:%S")
            if obj.wait_reason:
                return format_html("delayed until {} ({})", until, obj.wait_reason)
            return format_html("delayed until {}", until)
        return "waiting"

    @admin.display(description=_("progress"))
    def progress_display(self, obj: QueuedJob) -> str:
        if obj.progress is None:
            return "-"
        fraction = stored_fraction(obj.progress)
        if fraction is None:  # bad stored data (NaN, infinity): say so, never fail the page
            return format_html("{} ({}){}", _("unreadable"), repr(obj.progress),
                               f" {obj.progress_message}" if obj.progress_message else "")
        return format_html('<progress class="jobguard-progress" max="100" value="{}"></progress>'
                           ' {}%{}', round(fraction * 100), round(fraction * 100),
                           f" {obj.progress_message}" if obj.progress_message else "")

    @admin.display(description=_("last error"))
    def last_error_pretty(self, obj: QueuedJob) -> str:
        return _pretty_error(obj.last_error)

    @admin.display(description=_("payload"))
    def payload_pretty(self, obj: QueuedJob) -> str:
        return _pretty_json(obj.payload)

    context_pretty = admin.display(description=_("context"))(_context_pretty)

    @admin.action(description=_("Cancel selected jobs (running ones are asked to stop)"),
                  permissions=["change"])
    def cancel(self, request: HttpRequest, queryset) -> None:
        done = {operations.DELETED: 0, operations.STOPPING: 0}
        gone = 0
        for job_id in list(queryset.values_list("id", flat=True)):
            try:
                done[operations.cancel_job(str(job_id), actor=request.user.get_username(),
                                           using=queryset.db)] += 1
            except operations.JobNotQueuedError:
                gone += 1  # finished meanwhile
        if done[operations.DELETED]:
            self.message_user(request, ngettext(
                "%(n)d waiting job was deleted.", "%(n)d waiting jobs were deleted.",
                done[operations.DELETED]) % {"n": done[operations.DELETED]}, messages.SUCCESS)
        if done[operations.STOPPING]:
            self.message_user(request, ngettext(
                "%(n)d running job was asked to stop.", "%(n)d running jobs were asked to stop.",
                done[operations.STOPPING]) % {"n": done[operations.STOPPING]}, messages.SUCCESS)
        if gone:
            self.message_user(request, ngettext(
                "%(n)d job finished meanwhile and could not be cancelled.",
                "%(n)d jobs finished meanwhile and could not be cancelled.", gone)
                % {"n": gone}, messages.WARNING)

    @admin.action(description=_("Run selected jobs now"), permissions=["change"])
    def run_now(self, request: HttpRequest, queryset) -> None:
        selected = queryset.count()
        moved = operations.run_now(queryset)
        self.message_user(request, ngettext("%(n)d job is due now.", "%(n)d jobs are due now.",
                                            moved) % {"n": moved}, messages.SUCCESS)
        if moved < selected:
            self.message_user(request, ngettext(
                "%(n)d job is reserved by a worker and was left alone.",
                "%(n)d jobs are reserved by a worker and were left alone.",
                selected - moved) % {"n": selected - moved}, messages.WARNING)

    @admin.action(description=_("Requeue selected jobs whose worker is gone"),
                  permissions=["change"])
    def requeue(self, request: HttpRequest, queryset) -> None:
        """Put orphaned reservations back at once; a live worker's job is refused."""
        result = operations.requeue(list(queryset.reserved().values_list("id", flat=True)),
                                    actor=request.user.get_username(), using=queryset.db)
        unreserved = queryset.count() - len(result.requeued) - len(result.alive)
        if result.requeued:
            self.message_user(request, ngettext(
                "%(n)d job is queued again.", "%(n)d jobs are queued again.",
                len(result.requeued)) % {"n": len(result.requeued)}, messages.SUCCESS)
        if result.alive:
            self.message_user(request, ngettext(
                "%(n)d job is held by a live worker and was not requeued (cancel it instead).",
                "%(n)d jobs are held by a live worker and were not requeued (cancel them "
                "instead).", len(result.alive)) % {"n": len(result.alive)}, messages.ERROR)
        if unreserved > 0:
            self.message_user(request, ngettext(
                "%(n)d job is not reserved by any worker; there was nothing to requeue.",
                "%(n)d jobs are not reserved by any worker; there was nothing to requeue.",
                unreserved) % {"n": unreserved}, messages.WARNING)

    @admin.action(description=_("Delete selected queued jobs"), permissions=["delete"])
    def delete_selected(self, request: HttpRequest, queryset):
        """Confirm with a count, then delete every selected job no worker holds (all that
        the list matches with "select all"), in batches; their unique locks are freed."""
        deletable = queryset.unreserved()
        count = deletable.count()
        reserved = queryset.reserved().count()
        notes = [ngettext(
            "%(n)d selected job is reserved by a worker and will not be deleted.",
            "%(n)d selected jobs are reserved by a worker and will not be deleted.",
            reserved) % {"n": reserved}] if reserved else []
        if not count:
            self.message_user(request, _("None of the selected jobs can be deleted: a worker "
                                         "holds them."), messages.WARNING)
            return None
        page = self.confirm(request, deletable, count=count, notes=notes,
                            title=_("Delete queued jobs"), button=_("Yes, delete them"),
                            question=ngettext(
                                "Are you sure you want to delete %(n)d queued job? Its unique "
                                "lock is freed; this cannot be undone.",
                                "Are you sure you want to delete %(n)d queued jobs? Their "
                                "unique locks are freed; this cannot be undone.", count)
                            % {"n": count})
        if page is not None:
            for note in notes:
                self.message_user(request, note, messages.WARNING)
            return page
        result = operations.delete_matching(
            deletable, actor=request.user.get_username(),
            description=request.GET.get("q") or "the admin's selection")
        self.message_user(request, ngettext("Successfully deleted %(n)d queued job.",
                                            "Successfully deleted %(n)d queued jobs.",
                                            result.done) % {"n": result.done}, messages.SUCCESS)
        if result.skipped:
            self.message_user(request, ngettext(
                "%(n)d job was claimed by a worker meanwhile and was not deleted.",
                "%(n)d jobs were claimed by a worker meanwhile and were not deleted.",
                result.skipped) % {"n": result.skipped}, messages.WARNING)
        return None

    def has_delete_permission(self, request: HttpRequest, obj: QueuedJob | None = None) -> bool:
        # obj comes from get_queryset(), so its state is the annotation (database clock).
        if obj is not None and obj.state == "reserved":
            return False  # a worker is running it; it finishes, fails or its lease runs out
        return super().has_delete_permission(request, obj)

    def delete_model(self, request: HttpRequest, obj: QueuedJob) -> None:
        if operations.cancel([obj], actor=request.user.get_username()).reserved:
            self.message_user(request, _("The job was claimed by a worker meanwhile and was "
                                         "not deleted."), messages.WARNING)


class ExceptionFilter(admin.SimpleListFilter):
    """Failed jobs by exception class (``?exception=`` takes a dotted path or a class name)."""

    title = _("exception")
    parameter_name = "exception"

    def lookups(self, request, model_admin):
        rows = model_admin.get_queryset(request)
        return [(path, path.rsplit(".", 1)[-1]) for path in rows.exclude(exception_class="")
                .values_list("exception_class", flat=True).distinct().order_by(
                    "exception_class")]

    def queryset(self, request, queryset):
        if self.value():
            return queryset.filter(operations.search.exception_q(self.value()))
        return queryset


@admin.register(FailedJob)
class FailedJobAdmin(JobSearchAdminMixin, ReadOnlyDetailMixin, admin.ModelAdmin):
    list_display = ["name_display", "queue", "exception_short", "message_short",
                    "reason_short", "attempts", "failed_at_display"]
    list_filter = ["queue", JobNameFilter, ExceptionFilter, "failed_at"]
    search_fields = ["id", "name", "exception_class", "message", "reason"]
    date_hierarchy = "failed_at"
    actions = ["retry", "delete_selected"]
    fields = ["id", "name", "queue", "attempts", "priority", "failed_at", "reason",
              "exception_class", "message", "traceback_pretty", "last_error_pretty",
              "context_pretty", "payload_pretty"]
    readonly_fields = fields
    list_per_page = 50
    change_form_template = "admin/django_jobguard/failedjob/change_form.html"

    failed_at_display = _timestamp("failed_at", _("failed at"))

    @admin.display(description=_("exception"), ordering="exception_class")
    def exception_short(self, obj: FailedJob) -> str:
        return obj.exception_class.rsplit(".", 1)[-1]

    @admin.display(description=_("message"))
    def message_short(self, obj: FailedJob) -> str:
        return Truncator(obj.message).chars(70)

    @admin.display(description=_("why it ended"), ordering="reason")
    def reason_short(self, obj: FailedJob) -> str:
        return Truncator(obj.reason).chars(50)

    @admin.display(description=_("last error"))
    def last_error_pretty(self, obj: FailedJob) -> str:
        return _pretty_error(obj.last_error)

    @admin.display(description=_("traceback"))
    def traceback_pretty(self, obj: FailedJob) -> str:
        return format_html('<pre class="jobguard-traceback">{}</pre>', obj.traceback)

    @admin.display(description=_("payload"))
    def payload_pretty(self, obj: FailedJob) -> str:
        return _pretty_json(obj.payload)

    context_pretty = admin.display(description=_("context"))(_context_pretty)

    @admin.action(description=_("Retry selected failed jobs"), permissions=["change"])
    def retry(self, request: HttpRequest, queryset):
        """Confirm with a count, then queue every selected failed job again (all that the
        list matches with "select all"), in batches."""
        count = queryset.count()
        page = self.confirm(request, queryset, count=count, title=_("Retry failed jobs"),
                            button=_("Yes, retry them"), question=ngettext(
                                "Are you sure you want to retry %(n)d failed job? It is "
                                "queued again with fresh attempts.",
                                "Are you sure you want to retry %(n)d failed jobs? They are "
                                "queued again with fresh attempts.", count) % {"n": count})
        if page is not None:
            return page
        result = operations.retry_matching(
            queryset, actor=request.user.get_username(),
            description=request.GET.get("q") or "the admin's selection")
        self.message_user(request, ngettext("%(n)d job is queued again.",
                                            "%(n)d jobs are queued again.", result.done)
                          % {"n": result.done}, messages.SUCCESS)
        if result.skipped:
            self.message_user(request, ngettext(
                "%(n)d failed job was not retried: a queued job has its id already.",
                "%(n)d failed jobs were not retried: a queued job has their id already.",
                result.skipped) % {"n": result.skipped}, messages.WARNING)
        return None

    @admin.action(description=_("Forget selected failed jobs"), permissions=["delete"])
    def delete_selected(self, request: HttpRequest, queryset):
        """"Forget": confirm with a count, then delete every selected failed job (all that
        the list matches with "select all"), in batches."""
        count = queryset.count()
        page = self.confirm(request, queryset, count=count, title=_("Forget failed jobs"),
                            button=_("Yes, forget them"), question=ngettext(
                                "Are you sure you want to forget %(n)d failed job? It is "
                                "deleted and cannot be retried any more.",
                                "Are you sure you want to forget %(n)d failed jobs? They are "
                                "deleted and cannot be retried any more.", count)
                            % {"n": count})
        if page is not None:
            return page
        result = operations.forget_matching(
            queryset, actor=request.user.get_username(),
            description=request.GET.get("q") or "the admin's selection")
        self.message_user(request, ngettext("Successfully forgot %(n)d failed job.",
                                            "Successfully forgot %(n)d failed jobs.",
                                            result.done) % {"n": result.done}, messages.SUCCESS)
        return None

    def delete_model(self, request: HttpRequest, obj: FailedJob) -> None:
        try:
            operations.forget([obj], actor=request.user.get_username())
        except operations.FailedJobNotFound:
            pass  # forgotten meanwhile: gone all the same

    def get_urls(self):
        info = self.opts.app_label, self.opts.model_name
        return [path("<path:object_id>/retry/", self.admin_site.admin_view(self.retry_view),
                     name=f"{info[0]}_{info[1]}_retry"), *super().get_urls()]

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict | None = None):
        context = {"can_retry": self.has_change_permission(request), **(extra_context or {})}
        return super().change_view(request, object_id, form_url, extra_context=context)

    def retry_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The detail page's Retry button (POST, needs the change permission)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_change_permission(request):
            raise PermissionDenied
        changelist = reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_changelist",
                             current_app=self.admin_site.name)
        try:
            [job_id] = operations.retry([object_id], actor=request.user.get_username())
        except (ValueError, operations.FailedJobNotFound):
            self.message_user(request, _("This failed job no longer exists (retried or "
                                         "forgotten meanwhile)."), messages.WARNING)
            return HttpResponseRedirect(changelist)
        except IntegrityError:
            self.message_user(request, _("A queued job with this id exists already; it was "
                                         "not retried."), messages.ERROR)
            return HttpResponseRedirect(changelist)
        queued = reverse(f"admin:{self.opts.app_label}_queuedjob_change", args=[job_id],
                         current_app=self.admin_site.name)
        self.message_user(request, format_html(_('The job is queued again: <a href="{}">{}</a>.'),
                                               queued, job_id), messages.SUCCESS)
        return HttpResponseRedirect(changelist)


class WorkerAliveFilter(admin.SimpleListFilter):
    """Live workers, or the rows of workers that are gone (kept until housekeeping drops
    them after ``DEAD_WORKER_AFTER_LEASES`` leases)."""

    title = _("status")
    parameter_name = "status"

    def lookups(self, request, model_admin):
        return [("alive", _("alive")), ("gone", _("gone"))]

    def queryset(self, request, queryset):
        if self.value() not in ("alive", "gone"):
            return queryset
        alive = operations.live_workers(queryset.values_list("id", flat=True),
                                        using=queryset.db)
        return queryset.filter(id__in=alive) if self.value() == "alive" else \
            queryset.exclude(id__in=alive)


#: How the Workers page says why a worker is gone (``operations.worker_states``).
_GONE = {"ended": _("gone: its process has ended"),
         "silent": _("gone: no heartbeat for RETRY_AFTER"),
         "unknown": _("gone")}


@admin.register(Worker)
class WorkerAdmin(ReadOnlyDetailMixin, admin.ModelAdmin):
    """Workers with a verdict: alive, or gone (the process ended on this host, or no
    heartbeat), as the locks page and the queued jobs' "stale" flag judge them."""

    list_display = ["id_display", "status_display", "queues_display", "current_job_display",
                    "jobs_processed", "last_minute", "last_seen_at_display"]
    list_filter = [WorkerAliveFilter]
    readonly_fields = [f.name for f in Worker._meta.fields]

    class Media:
        css = {"all": ["django_jobguard/admin-lists.css"]}
    ordering = ["-last_seen_at"]

    started_at_display = _timestamp("started_at", _("started at"))
    last_seen_at_display = _timestamp("last_seen_at", _("last heartbeat"))

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None):
        response = super().changelist_view(request, extra_context)
        cl = response.context_data.get("cl") if hasattr(response, "context_data") else None
        if cl is not None:
            states = operations.worker_states([row.id for row in cl.result_list],
                                              using=cl.queryset.db)
            for row in cl.result_list:
                row.jobguard_status = states.get(row.id, "unknown")
        return response

    @admin.display(description=_("worker"), ordering="id")
    def id_display(self, obj: Worker) -> str:
        """``host:pid:token``, breakable after each colon (long host names)."""
        return format_html_join(mark_safe(":<wbr>"), "{}", ((p,) for p in obj.id.split(":")))

    @admin.display(description=_("queues"), ordering="queues")
    def queues_display(self, obj: Worker) -> str:
        return ", ".join(obj.queues.split(","))

    @admin.display(description=_("current job"), ordering="current_job")
    def current_job_display(self, obj: Worker) -> str:
        if not obj.current_job:
            return "-"
        return format_html('<code title="{}">{}…</code>', obj.current_job, obj.current_job[:8])

    @admin.display(description=_("last minute: done / failed"))
    def last_minute(self, obj: Worker) -> str:
        return f"{obj.done_last_minute} / {obj.failed_last_minute}"

    @admin.display(description=_("status"))
    def status_display(self, obj: Worker) -> str:
        status = getattr(obj, "jobguard_status", None) or operations.worker_states(
            [obj.id]).get(obj.id, "unknown")
        if status == "alive":
            return format_html('<span class="jobguard-alive">{}</span>', _("alive"))
        return format_html('<strong class="jobguard-stale">{}</strong>', _GONE[status])


class PauseQueueForm(forms.ModelForm):
    """Pause a queue: its name, checked as ``jobs_pause`` checks it."""

    force = forms.BooleanField(required=False, label=_("Pause even if nothing uses it yet"))

    class Meta:
        model = PausedQueue
        fields = ["queue"]

    def clean(self):
        data = super().clean()
        name = data.get("queue")
        if name is not None:
            try:
                data["queue"] = operations.check_queue_name(name)
                if not data.get("force") and not operations.is_known_queue(data["queue"]):
                    raise operations.QueueNameError(
                        f"Unknown queue {data['queue']!r}: no job, worker or registered job "
                        f"uses it. Tick the box to pause it ahead of time.")
            except operations.QueueNameError as exc:
                raise forms.ValidationError({"queue": str(exc)})
        return data


@admin.register(PausedQueue)
class PausedQueueAdmin(admin.ModelAdmin):
    """Paused queues: "add" pauses one, the "Resume" action resumes; both need the change
    permission of paused queues."""

    form = PauseQueueForm
    list_display = ["queue", "paused_at_display", "paused_by"]
    paused_at_display = _timestamp("paused_at", _("paused at"))
    actions = ["resume"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return self.has_change_permission(request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return obj is None and super().has_change_permission(request)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # resume through the action, which wakes listening workers

    def save_model(self, request: HttpRequest, obj: PausedQueue, form: Any, change: bool) -> None:
        if not operations.pause(obj.queue, force=True, actor=request.user.get_username()):
            self.message_user(request, _("The queue was paused already."), messages.WARNING)

    @admin.action(description=_("Resume selected queues"), permissions=["change"])
    def resume(self, request: HttpRequest, queryset) -> None:
        resumed = 0
        for row in list(queryset):
            try:
                operations.resume(row.queue, actor=request.user.get_username())
                resumed += 1
            except operations.QueueNameError:
                pass  # resumed meanwhile
        self.message_user(request, ngettext("%(n)d queue resumed.", "%(n)d queues resumed.",
                                            resumed) % {"n": resumed}, messages.SUCCESS)


class ResultNameFilter(JobNameFilter):
    result = True


@admin.register(JobResult)
class JobResultAdmin(ReadOnlyDetailMixin, admin.ModelAdmin):
    list_display = ["name_display", "queue", "status", "attempts", "finished_at_display", "id"]
    list_filter = ["status", "queue", ResultNameFilter]
    search_fields = ["id", "name", "payload__task"]
    readonly_fields = [f.name for f in JobResult._meta.fields]

    finished_at_display = _timestamp("finished_at", _("finished at"))

    @admin.display(description=_("job name"), ordering="name")
    def name_display(self, obj: JobResult) -> str:
        return _breakable(registry.display_name(obj.name, obj.payload, result=True))


@admin.register(ScheduleTick)
class ScheduleTickAdmin(ReadOnlyDetailMixin, admin.ModelAdmin):
    """Each periodic tick recorded, with the schedules' last and next runs above the list."""

    change_list_template = "admin/django_jobguard/schedule_runs.html"
    list_display = ["schedule", "tick", "job_id", "skipped", "enqueued_at"]
    list_filter = ["schedule", "skipped"]
    search_fields = ["schedule", "job_id"]
    readonly_fields = [f.name for f in ScheduleTick._meta.fields]

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None):
        context = {"schedules": schedules.schedule_status(), **(extra_context or {})}
        return super().changelist_view(request, extra_context=context)


@admin.register(Chain)
class ChainAdmin(ReadOnlyDetailMixin, admin.ModelAdmin):
    """Chains with each link's status (a failed link's job is retried from failed jobs)."""

    list_display = ["__str__", "status", "progress", "created_at", "finished_at"]
    list_filter = ["status"]
    search_fields = ["id", "name"]
    fields = ["id", "name", "status", "link_table", "created_at", "finished_at"]
    readonly_fields = fields

    @staticmethod
    def _links(obj: Chain) -> list[dict] | None:
        """The chain's links, or ``None`` when the stored value is not a list of objects
        (bad stored data: the page says so instead of failing)."""
        links = obj.links
        if isinstance(links, list) and all(isinstance(link, dict) for link in links):
            return links
        return None

    @admin.display(description=_("links done"))
    def progress(self, obj: Chain) -> str:
        links = self._links(obj)
        if links is None:
            return _("unreadable links")
        done = sum(link.get("status") == "done" for link in links)
        return f"{done} / {len(links)}"

    @admin.display(description=_("links"))
    def link_table(self, obj: Chain) -> str:
        from django.utils.html import format_html_join

        links = self._links(obj)
        if links is None:
            return format_html("{}: <code>{}</code>", _("unreadable links (not a list of "
                                                        "objects)"), repr(obj.links)[:500])
        rows = format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", (
            (i + 1, link.get("job", ""), link.get("id", ""), link.get("status", ""))
            for i, link in enumerate(links)))
        return format_html("<table><tr><th>#</th><th>{}</th><th>{}</th><th>{}</th></tr>{}"
                           "</table>", _("job"), _("job id"), _("status"), rows)


@admin.register(Batch)
class BatchAdmin(ReadOnlyDetailMixin, admin.ModelAdmin):
    """Batches with their counts and progress; "Cancel" skips the jobs not started yet."""

    list_display = ["__str__", "status", "progress_bar", "total_jobs", "pending_jobs",
                    "failed_jobs", "created_at", "finished_at"]
    list_filter = [("finished_at", admin.EmptyFieldListFilter),
                   ("cancelled_at", admin.EmptyFieldListFilter)]
    search_fields = ["id", "name"]
    fields = ["id", "name", "status", "progress_bar", "total_jobs", "pending_jobs",
              "failed_jobs", "failed_job_ids", "allow_failures", "callback_list",
              "callbacks_queued", "created_at", "cancelled_at", "finished_at"]
    readonly_fields = fields
    actions = ["cancel_batches"]

    @admin.display(description=_("status"))
    def status(self, obj: Batch) -> str:
        return obj.status

    @admin.display(description=_("progress"))
    def progress_bar(self, obj: Batch) -> str:
        percent = round(obj.progress * 100)
        return format_html('<progress max="100" value="{}" title="{} %"></progress> {} / {}',
                           percent, percent, obj.processed_jobs, obj.total_jobs)

    @admin.display(description=_("callbacks"))
    def callback_list(self, obj: Batch) -> str:
        from django.utils.html import format_html_join

        return format_html_join(", ", "{}: {}", (
            (kind, job.get("job", "")) for kind, jobs in obj.callbacks.items() for job in jobs)
        ) or "-"

    @admin.action(description=_("Cancel selected batches (jobs not started are skipped)"),
                  permissions=["change"])
    def cancel_batches(self, request: HttpRequest, queryset) -> None:
        done = sum(batches.cancel(row.id) for row in queryset)
        self.message_user(request, ngettext("Cancelled %(count)d batch.",
                                            "Cancelled %(count)d batches.", done)
                          % {"count": done}, messages.SUCCESS)


# -- locks and throttles: views over the store -------------------------------------------


class StoreViewAdmin(admin.ModelAdmin):
    """Base for admin pages that show a store's contents instead of model rows.

    ``GET <changelist>?store=<alias>`` lists; ``POST <changelist>/<action>/`` with ``key``
    and ``store`` acts on one entry and needs the model's change permission.
    """

    template_name: str
    action_name: str  # the URL segment and view name of the POST action
    action_done: str  # message after a successful action, with {key}
    action_missing: str  # message when the key was not found

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self):
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path("", self.admin_site.admin_view(self.store_view), name=f"{prefix}_changelist"),
            path(f"{self.action_name}/", self.admin_site.admin_view(self.action_view),
                 name=f"{prefix}_{self.action_name}"),
        ]

    def rows(self, store) -> list:
        raise NotImplementedError

    def page(self, store, request: HttpRequest) -> tuple[list, dict]:
        """The rows to show and extra context (paging, filters); default: all rows."""
        return self.rows(store), {}

    def act(self, store, key: str, request: HttpRequest) -> bool:
        raise NotImplementedError

    def confirmation(self, store, key: str, request: HttpRequest) -> HttpResponse | None:
        """A page asking to confirm the action first, or None to act at once."""
        return None

    def _changelist_url(self, alias: str) -> str:
        url = reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_changelist",
                      current_app=self.admin_site.name)
        return f"{url}?{urlencode({'store': alias})}"

    def store_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        aliases = operations.usable_stores()
        alias = request.GET.get("store") or (aliases[0] if aliases else "")
        rows, error, extra = [], "", {}
        try:
            store = operations.store_for(alias)
            rows, extra = self.page(store, request)
        except (operations.UnknownStoreError, ValueError) as exc:  # ValueError: a bad filter
            error = str(exc)
        except NotImplementedError:
            error = _("The store %(alias)s cannot list these entries yet.") % {"alias": alias}
        except Exception as exc:  # a store that is down must not take the admin page with it
            logger.exception("Listing store %s failed.", alias)
            error = _("Could not read the store %(alias)s: %(error)s") % {
                "alias": alias, "error": exc}
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": self.opts.verbose_name_plural.capitalize(),
            "stores": aliases,
            "store": alias,
            "rows": rows,
            "error": error,
            "can_change": self.has_change_permission(request),
            "action_url": reverse(
                f"admin:{self.opts.app_label}_{self.opts.model_name}_{self.action_name}",
                current_app=self.admin_site.name),
            **extra,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, self.template_name, context)

    def action_view(self, request: HttpRequest) -> HttpResponse:
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_change_permission(request):
            raise PermissionDenied
        alias, key = request.POST.get("store", ""), request.POST.get("key", "")
        try:
            store = operations.store_for(alias)
        except operations.UnknownStoreError as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return HttpResponseRedirect(self._changelist_url(""))
        confirm = self.confirmation(store, key, request)
        if confirm is not None:
            return confirm
        try:
            done = bool(key) and self.act(store, key, request)
        except NotImplementedError:
            self.message_user(request, _("The store %(alias)s cannot do this yet.")
                              % {"alias": alias}, messages.ERROR)
        else:
            if done:
                self.message_user(request, self.action_done.format(key=key), messages.SUCCESS)
            else:
                self.message_user(request, self.action_missing.format(key=key),
                                  messages.WARNING)
        return HttpResponseRedirect(self._changelist_url(store.alias))


@admin.register(Lock)
class LockAdmin(StoreViewAdmin):
    template_name = "admin/django_jobguard/locks.html"
    action_name = "release"
    action_done = "Released lock {key}."
    action_missing = "Lock {key} was not held (it may have been released meanwhile)."

    #: Locks on one page; a page reads only these (a keyset in SQL, SCAN in Redis).
    per_page = 100

    def page(self, store, request: HttpRequest) -> tuple[list, dict]:
        """One keyed page of locks, narrowed by ``?kind=`` and ``?q=`` (key prefix); the
        "next page" link carries the cursor. A key typed in full finds that lock at once."""
        kind = request.GET.get("kind") or None
        prefix, cursor = request.GET.get("q", "").strip(), request.GET.get("cursor", "")
        more = request.GET.get("more") == "1"
        query = {"store": store.alias, "kind": kind or "", "q": prefix}
        context = {"kinds": operations.LOCK_KINDS, "kind": kind or "", "q": prefix,
                   "paged": bool(cursor) or more, "first_url": "?" + urlencode(query),
                   "next_url": "", "more_url": ""}
        # A key typed in full is looked up directly: no page to read (on Redis that would
        # scan the keyspace for the prefix); the keys that merely start with it are a link.
        exact = operations.inspect_lock(store, prefix) if prefix and not (cursor or more) \
            else None
        if exact is not None:
            context["more_url"] = "?" + urlencode({**query, "more": "1"})
            return [self._row(exact)], context
        page = operations.lock_page(store, kind=kind, prefix=prefix, cursor=cursor,
                                    limit=self.per_page)
        if page.cursor:
            context["next_url"] = "?" + urlencode({**query, "cursor": page.cursor})
        return [self._row(row) for row in page.rows], context

    def _row(self, row: operations.LockRow) -> dict:
        return {
            "key": row.key, "kind": row.info.kind, "owner": row.info.owner,
            "token": row.info.token, "acquired_at": row.info.acquired_at,
            "expires": _seconds_label(row.expires_in, none="never"),
            "job_id": row.info.job_id, "stale": row.stale, "stale_reason": row.stale_reason,
        }

    def act(self, store, key: str, request: HttpRequest) -> bool:
        return operations.force_release(store, key, actor=request.user.get_username())

    def confirmation(self, store, key: str, request: HttpRequest) -> HttpResponse | None:
        """A lock whose job is still queued or running on a live worker (not stale) is
        released only after a confirmation; stale or job-less locks at once."""
        if request.POST.get("confirm") == "yes" or not key:
            return None
        row = operations.inspect_lock(store, key)
        if row is None or row.stale or not row.info.job_id:
            return None
        context = {**self.admin_site.each_context(request), "opts": self.opts,
                   "title": _("Force release"), "lock": row, "store": store.alias,
                   "back_url": self._changelist_url(store.alias),
                   "action_url": request.path}
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/django_jobguard/lock_release_confirmation.html",
                                context)


@admin.register(Throttle)
class ThrottleAdmin(StoreViewAdmin):
    template_name = "admin/django_jobguard/throttles.html"
    action_name = "reset"
    action_done = "Reset {key}."
    action_missing = "{key} had no state to reset."

    def rows(self, store) -> list:
        return [{
            "key": row.key, "kind": row.info.kind, "hits": row.info.hits,
            "limit": row.info.limit, "state": row.info.state or "closed",
            "resets_at": row.info.resets_at,
            "resets_in": "-" if row.resets_in is None else _duration(row.resets_in),
        } for row in operations.inspect_throttles(store)]

    def store_view(self, request: HttpRequest) -> HttpResponse:
        response = super().store_view(request)
        rows = response.context_data["rows"]
        response.context_data["windows"] = [r for r in rows if r["kind"] != "circuit"]
        response.context_data["circuits"] = [r for r in rows if r["kind"] == "circuit"]
        return response

    def act(self, store, key: str, request: HttpRequest) -> bool:
        return operations.reset_throttle(store, key, actor=request.user.get_username())
