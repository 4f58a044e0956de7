"""Queued jobs (waiting, delayed, reserved; run now, requeue, cancel, delete) and kept
results (``JobResult``)."""

from __future__ import annotations

from django.contrib import admin, messages
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from django_jobguard import debounce, operations, registry
from django_jobguard.admin.base import (
    HideArgumentsMixin,
    JobNameFilter,
    JobSearchAdminMixin,
    ReadOnlyDetailMixin,
    TagFilter,
    breakable,
    pretty_context,
    pretty_error,
    pretty_json,
    tags_display,
    timestamp_column,
)
from django_jobguard.models import JobResult, QueuedJob, QueuedJobQuerySet
from django_jobguard.progress import stored_fraction


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
class QueuedJobAdmin(JobSearchAdminMixin, ReadOnlyDetailMixin, admin.ModelAdmin):
    # Fits at 1280 px beside the admin's navigation: the id is in each row's link and in the
    # search, not a column of its own.
    list_display = ["name_display", "arguments_display", "queue", "state_display", "attempts",
                    "priority", "available_at_display"]
    list_filter = ["queue", StateFilter, JobNameFilter, TagFilter]
    search_fields = ["id", "name", "=fair_key"]  # a tenant's rows: its fair key, exactly
    ordering = ["queue", "-priority", "available_at"]
    actions = ["run_now", "requeue", "cancel", "delete_selected"]
    fields = readonly_fields = (
        "id", "name", "queue", "fair_key", "state_display", "progress_display", "attempts",
        "exceptions", "priority", "available_at", "reserved_at", "reserved_by", "created_at",
        "wait_reason", "cancel_requested_at", "tags_display", "last_error_pretty",
        "context_pretty",
        "payload_pretty")
    list_per_page = 50

    available_at_display = timestamp_column("available_at", _("available at"))
    tags_display = tags_display

    def get_queryset(self, request):
        queryset = super().get_queryset(request)
        assert isinstance(queryset, QueuedJobQuerySet)  # the model's manager makes them
        return queryset.with_state()

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
        if obj.debounce_key and obj.reserved_at is None:  # dispatches still fold into it
            return debounce.describe(obj)
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
        return pretty_error(obj.last_error)

    @admin.display(description=_("context"))
    def context_pretty(self, obj: QueuedJob) -> str:
        return pretty_context(obj.payload)

    @admin.display(description=_("payload"))
    def payload_pretty(self, obj: QueuedJob) -> str:
        return pretty_json(obj.payload)

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


class ResultNameFilter(JobNameFilter):
    result = True


@admin.register(JobResult)
class JobResultAdmin(HideArgumentsMixin, ReadOnlyDetailMixin, admin.ModelAdmin):
    list_display = ["name_display", "queue", "status", "attempts", "finished_at_display", "id"]
    list_filter = ["status", "queue", ResultNameFilter]
    search_fields = ["id", "name", "payload__task"]
    fields = readonly_fields = tuple(f.name for f in JobResult._meta.fields)
    argument_fields = ("payload",)

    finished_at_display = timestamp_column("finished_at", _("finished at"))

    @admin.display(description=_("job name"), ordering="name")
    def name_display(self, obj: JobResult) -> str:
        return breakable(registry.display_name(obj.name, obj.payload, result=True))
