"""Finished runs (``JOBGUARD["HISTORY"]``): a read-only list searched by job name, arguments
and error, filtered by state, queue and time range; a read-only detail page."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from django_jobguard.admin.base import (
    ArgumentSearchMixin,
    TagFilter,
    arguments_preview,
    pretty_error,
    pretty_json,
    tags_display,
    timestamp_column,
)
from django_jobguard.models import FinishedRun


@admin.register(FinishedRun)
class FinishedRunAdmin(ArgumentSearchMixin, admin.ModelAdmin):
    """Runs are written by workers and pruned by them: nothing is added, changed or deleted
    here."""

    list_display = ["name", "queue", "state", "arguments_short", "attempt", "runtime_display",
                    "wait_display", "finished_at_display"]
    list_filter = ["state", "queue", TagFilter, "finished_at"]
    search_fields = ["name", "arguments", "error"]
    search_help_text = _('Names, errors, text in the arguments, or arguments as JSON by '
                         'parameter name: customer_id=9 kwargs__invoice_id=7 args__0="abc"')
    arguments_field = "arguments"
    argument_columns = ("arguments_short",)
    argument_fields = ("arguments_pretty",)
    argument_search_fields = ("arguments",)
    date_hierarchy = "finished_at"
    fields = readonly_fields = (
        "job_id", "name", "queue", "state", "attempt", "worker", "started_at", "finished_at",
        "runtime", "wait", "result_size", "tags_display", "arguments_pretty", "error_pretty")
    list_per_page = 50
    show_full_result_count = False  # no COUNT(*) over a million rows per page view

    finished_at_display = timestamp_column("finished_at", _("finished at"))
    tags_display = tags_display

    @admin.display(description=_("arguments"))
    def arguments_short(self, obj: FinishedRun) -> str:
        return arguments_preview(obj.arguments)

    @admin.display(description=_("runtime (s)"), ordering="runtime")
    def runtime_display(self, obj: FinishedRun) -> str:
        return "-" if obj.runtime is None else f"{obj.runtime:.3f}"

    @admin.display(description=_("wait (s)"), ordering="wait")
    def wait_display(self, obj: FinishedRun) -> str:
        return "-" if obj.wait is None else f"{obj.wait:.3f}"

    @admin.display(description=_("arguments"))
    def arguments_pretty(self, obj: FinishedRun) -> str:
        return pretty_json(obj.arguments)

    @admin.display(description=_("error"))
    def error_pretty(self, obj: FinishedRun) -> str:
        return pretty_error(obj.error)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
