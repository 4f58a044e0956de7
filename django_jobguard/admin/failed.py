"""Failed jobs: filtered by exception, retried or forgotten in bulk, retried one by one
from the detail page."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.text import Truncator
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from django_jobguard import operations
from django_jobguard.admin.base import (
    JobNameFilter,
    JobSearchAdminMixin,
    ReadOnlyDetailMixin,
    TagFilter,
    pretty_context,
    pretty_error,
    pretty_json,
    tags_display,
    timestamp_column,
)
from django_jobguard.models import FailedJob


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
        value = self.value()
        if value:
            return queryset.filter(operations.search.exception_q(value))
        return queryset


@admin.register(FailedJob)
class FailedJobAdmin(JobSearchAdminMixin, ReadOnlyDetailMixin, admin.ModelAdmin):
    list_display = ["name_display", "arguments_display", "queue", "exception_short",
                    "message_short", "reason_short", "attempts", "failed_at_display"]
    list_filter = ["queue", JobNameFilter, ExceptionFilter, TagFilter, "failed_at"]
    search_fields = ["id", "name", "exception_class", "message", "reason"]
    date_hierarchy = "failed_at"
    actions = ["retry", "delete_selected"]
    fields = readonly_fields = (
        "id", "name", "queue", "attempts", "priority", "failed_at", "reason", "exception_class",
        "message", "tags_display", "traceback_pretty", "last_error_pretty", "context_pretty",
        "payload_pretty")
    list_per_page = 50
    change_form_template = "admin/django_jobguard/failedjob/change_form.html"

    failed_at_display = timestamp_column("failed_at", _("failed at"))
    tags_display = tags_display

    @admin.display(description=_("exception"), ordering="exception_class")
    def exception_short(self, obj: FailedJob) -> str:
        return obj.exception_class.rsplit(".", 1)[-1]

    @admin.display(description=_("message"))
    def message_short(self, obj: FailedJob) -> str:
        return Truncator(obj.message).chars(70)

    @admin.display(description=_("why it ended"), ordering="reason")
    def reason_short(self, obj: FailedJob) -> str:
        return Truncator(obj.reason).chars(50)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        """The last error only when it is not the traceback shown above it (a job failed
        by a limit, such as its attempts, keeps the error an earlier run raised)."""
        fields = list(super().get_fields(request, obj))
        if obj is not None and (not obj.last_error or (
                obj.traceback.strip() and obj.traceback.strip() in obj.last_error)):
            fields.remove("last_error_pretty")
        return fields

    @admin.display(description=_("last error"))
    def last_error_pretty(self, obj: FailedJob) -> str:
        return pretty_error(obj.last_error)

    @admin.display(description=_("traceback"))
    def traceback_pretty(self, obj: FailedJob) -> str:
        return format_html('<pre class="jobguard-traceback">{}</pre>', obj.traceback)

    @admin.display(description=_("context"))
    def context_pretty(self, obj: FailedJob) -> str:
        return pretty_context(obj.payload)

    @admin.display(description=_("payload"))
    def payload_pretty(self, obj: FailedJob) -> str:
        return pretty_json(obj.payload)

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
        done = str(_('The job is queued again: <a href="{}">{}</a>.'))
        self.message_user(request, format_html(done, queued, job_id), messages.SUCCESS)
        return HttpResponseRedirect(changelist)
