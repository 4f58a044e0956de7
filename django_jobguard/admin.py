"""The Django admin for jobguard: queued and failed jobs, locks, throttles and workers.

Queued and failed jobs are ordinary model admins (read-only detail pages, actions for what
operators do). Locks and throttles may live in Redis, so their pages are views over the store
API (``Store.locks()`` / ``Store.throttles()``), registered on the ``Lock`` and ``Throttle``
models only to get a place in the admin, the model permissions and the URL names.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.actions import delete_selected as django_delete_selected
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.text import Truncator
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from django_jobguard import batches, operations, schedules
from django_jobguard.dashboard import DashboardAdmin
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


@admin.register(QueuedJob)
class QueuedJobAdmin(ReadOnlyDetailMixin, admin.ModelAdmin):
    list_display = ["name", "queue", "state_display", "progress_display", "attempts",
                    "priority", "available_at", "created_at", "id"]
    list_filter = ["queue", StateFilter, "name"]
    search_fields = ["id", "name"]
    ordering = ["queue", "-priority", "available_at"]
    actions = ["run_now", "cancel", "delete_selected"]
    fields = ["id", "name", "queue", "state_display", "progress_display", "attempts",
              "exceptions", "priority", "available_at", "reserved_at", "reserved_by",
              "created_at", "wait_reason", "cancel_requested_at", "last_error_pretty",
              "payload_pretty"]
    readonly_fields = fields
    list_per_page = 50

    def get_queryset(self, request):
        return super().get_queryset(request).with_state()

    @admin.display(description=_("state"), ordering="jobguard_state")
    def state_display(self, obj: QueuedJob) -> str:
        state = obj.state  # the annotation of get_queryset(): database clock
        if state == "reserved":
            since = timezone.localtime(obj.reserved_at).strftime("%Y-%m-%d %H:%M:%S")
            if obj.cancel_requested_at is not None:
                return format_html("reserved by <code>{}</code> since {}, "
                                   "<strong>cancel requested</strong>", obj.reserved_by, since)
            return format_html("reserved by <code>{}</code> since {}", obj.reserved_by, since)
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
        return format_html('<progress class="jobguard-progress" max="100" value="{}"></progress>'
                           ' {}%{}', round(obj.progress * 100), round(obj.progress * 100),
                           f" {obj.progress_message}" if obj.progress_message else "")

    @admin.display(description=_("last error"))
    def last_error_pretty(self, obj: QueuedJob) -> str:
        return _pretty_error(obj.last_error)

    @admin.display(description=_("payload"))
    def payload_pretty(self, obj: QueuedJob) -> str:
        return _pretty_json(obj.payload)

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

    @admin.action(description=_("Delete selected queued jobs"), permissions=["delete"])
    def delete_selected(self, request: HttpRequest, queryset):
        """Django's confirm-then-delete, minus jobs a worker is running right now."""
        reserved = queryset.reserved().count()
        if reserved and not request.POST.get("post"):
            self.message_user(request, ngettext(
                "%(n)d selected job is reserved by a worker and will not be deleted.",
                "%(n)d selected jobs are reserved by a worker and will not be deleted.",
                reserved) % {"n": reserved}, messages.WARNING)
        deletable = queryset.unreserved()
        if not deletable.exists():
            return None
        return django_delete_selected(self, request, deletable)

    def delete_queryset(self, request: HttpRequest, queryset) -> None:
        result = operations.cancel(list(queryset), actor=request.user.get_username(),
                                   using=queryset.db)
        if result.reserved:
            self.message_user(request, ngettext(
                "%(n)d job was claimed by a worker meanwhile and was not deleted.",
                "%(n)d jobs were claimed by a worker meanwhile and were not deleted.",
                len(result.reserved)) % {"n": len(result.reserved)}, messages.WARNING)

    def has_delete_permission(self, request: HttpRequest, obj: QueuedJob | None = None) -> bool:
        # obj comes from get_queryset(), so its state is the annotation (database clock).
        if obj is not None and obj.state == "reserved":
            return False  # a worker is running it; it finishes, fails or its lease runs out
        return super().has_delete_permission(request, obj)

    def delete_model(self, request: HttpRequest, obj: QueuedJob) -> None:
        if operations.cancel([obj], actor=request.user.get_username()).reserved:
            self.message_user(request, _("The job was claimed by a worker meanwhile and was "
                                         "not deleted."), messages.WARNING)


@admin.register(FailedJob)
class FailedJobAdmin(ReadOnlyDetailMixin, admin.ModelAdmin):
    list_display = ["name", "queue", "exception_short", "message_short", "reason_short",
                    "attempts", "failed_at", "id"]
    list_filter = ["queue", "name", "failed_at"]
    search_fields = ["id", "name", "exception_class", "message", "reason"]
    date_hierarchy = "failed_at"
    actions = ["retry", "delete_selected"]
    fields = ["id", "name", "queue", "attempts", "priority", "failed_at", "reason",
              "exception_class", "message", "traceback_pretty", "last_error_pretty",
              "payload_pretty"]
    readonly_fields = fields
    list_per_page = 50

    @admin.display(description=_("exception"), ordering="exception_class")
    def exception_short(self, obj: FailedJob) -> str:
        return obj.exception_class.rsplit(".", 1)[-1]

    @admin.display(description=_("message"))
    def message_short(self, obj: FailedJob) -> str:
        return Truncator(obj.message).chars(120)

    @admin.display(description=_("why it ended"), ordering="reason")
    def reason_short(self, obj: FailedJob) -> str:
        return Truncator(obj.reason).chars(80)

    @admin.display(description=_("last error"))
    def last_error_pretty(self, obj: FailedJob) -> str:
        return _pretty_error(obj.last_error)

    @admin.display(description=_("traceback"))
    def traceback_pretty(self, obj: FailedJob) -> str:
        return format_html('<pre class="jobguard-traceback">{}</pre>', obj.traceback)

    @admin.display(description=_("payload"))
    def payload_pretty(self, obj: FailedJob) -> str:
        return _pretty_json(obj.payload)

    @admin.action(description=_("Retry selected failed jobs"), permissions=["change"])
    def retry(self, request: HttpRequest, queryset) -> None:
        ids = operations.retry(queryset, actor=request.user.get_username(), using=queryset.db)
        self.message_user(request, ngettext("%(n)d job is queued again.",
                                            "%(n)d jobs are queued again.", len(ids))
                          % {"n": len(ids)}, messages.SUCCESS)

    def delete_queryset(self, request: HttpRequest, queryset) -> None:
        """"Forget selected failed jobs", after Django's confirmation page."""
        operations.forget(queryset, actor=request.user.get_username(), using=queryset.db)

    def delete_model(self, request: HttpRequest, obj: FailedJob) -> None:
        try:
            operations.forget([obj], actor=request.user.get_username())
        except operations.FailedJobNotFound:
            pass  # forgotten meanwhile: gone all the same

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> dict:
        # Django 6.1 passes ``action_location`` (and warns about overrides without it);
        # Django 5.2 and 6.0 do not know the argument.
        if action_location is None:
            actions = super().get_actions(request)
        else:
            actions = super().get_actions(request, action_location=action_location)
        if "delete_selected" in actions:  # "forget", with Django's confirmation page
            action = actions["delete_selected"]
            label = _("Forget selected failed jobs")
            if isinstance(action, tuple):  # Django < 6.1
                actions["delete_selected"] = (action[0], action[1], label)
            else:  # Django 6.1: an Action dataclass
                actions["delete_selected"] = dataclasses.replace(
                    action, description=label, plural_description=label)
        return actions


@admin.register(Worker)
class WorkerAdmin(ReadOnlyDetailMixin, admin.ModelAdmin):
    list_display = ["id", "hostname", "pid", "queues", "current_job", "jobs_processed",
                    "done_last_minute", "failed_last_minute", "started_at", "last_seen_at"]
    readonly_fields = [f.name for f in Worker._meta.fields]


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
    list_display = ["queue", "paused_at", "paused_by"]
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


@admin.register(JobResult)
class JobResultAdmin(ReadOnlyDetailMixin, admin.ModelAdmin):
    list_display = ["name", "queue", "status", "attempts", "finished_at", "id"]
    list_filter = ["status", "queue", "name"]
    search_fields = ["id", "name"]
    readonly_fields = [f.name for f in JobResult._meta.fields]


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

    @admin.display(description=_("links done"))
    def progress(self, obj: Chain) -> str:
        done = sum(link.get("status") == "done" for link in obj.links)
        return f"{done} / {len(obj.links)}"

    @admin.display(description=_("links"))
    def link_table(self, obj: Chain) -> str:
        from django.utils.html import format_html_join

        rows = format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", (
            (i + 1, link.get("job", ""), link.get("id", ""), link.get("status", ""))
            for i, link in enumerate(obj.links)))
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
