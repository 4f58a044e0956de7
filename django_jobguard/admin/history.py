"""Finished runs (``JOBGUARD["HISTORY"]``): a read-only list searched by job id, job name,
arguments and error, filtered by state, queue, tag and time range; a read-only detail page.

The list stays fast with a million runs: its count is exact up to 10,000 runs, then
PostgreSQL's estimate ("about N", :class:`~django_jobguard.admin.base.EstimatedCountPaginator`);
its filters offer fixed states, the queues of the run statistics and the tags of the newest
runs (no DISTINCT over the table); a job id or a recorded job name is looked up in an index
instead of searched as text; there is no date hierarchy (its links scan every run's date), the
*finished at* filter takes its place."""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from django_jobguard import history
from django_jobguard import tags as job_tags
from django_jobguard.admin.base import (
    ArgumentSearchMixin,
    EstimatedCountPaginator,
    TagFilter,
    arguments_preview,
    pretty_error,
    pretty_json,
    tags_display,
    timestamp_column,
)
from django_jobguard.models import FinishedRun, RunStatistic

#: The newest runs whose tags the tag filter offers.
TAGGED_RUNS_READ = 2000


class RunStateFilter(admin.SimpleListFilter):
    """The states a run is recorded in (a fixed list: no DISTINCT over the runs)."""

    title = _("state")
    parameter_name = "state__exact"

    def lookups(self, request, model_admin):
        return [(state, state) for state in sorted(history.RECORDED_STATES)]

    def queryset(self, request, queryset):
        value = self.value()
        return queryset.filter(state=value) if value else queryset


class RunQueueFilter(admin.SimpleListFilter):
    """The queues of the run statistics' hour rows (a few thousand rows, not the runs)."""

    title = _("queue")
    parameter_name = "queue__exact"

    def lookups(self, request, model_admin):
        db = model_admin.get_queryset(request).db
        queues = set(RunStatistic.objects.using(db).filter(
            span=history.HOUR, bucket=history.SUMMARY).values_list("queue", flat=True)
            .distinct().order_by())
        value = self.value()
        if value:
            queues.add(value)
        return [(queue, queue) for queue in sorted(queues)]

    def queryset(self, request, queryset):
        value = self.value()
        return queryset.filter(queue=value) if value else queryset


class RunTagFilter(TagFilter):
    """The tags of the newest :data:`TAGGED_RUNS_READ` runs (read down the time index)."""

    def lookups(self, request, model_admin):
        rows = model_admin.model._default_manager.using(model_admin.get_queryset(request).db)
        texts = rows.order_by("-finished_at").values_list("tags", flat=True)[:TAGGED_RUNS_READ]
        found = {tag for text in texts if text for tag in job_tags.decode(text)}
        value = self.value()
        if value:
            found.add(value)
        return [(tag, tag) for tag in sorted(found)]


@admin.register(FinishedRun)
class FinishedRunAdmin(ArgumentSearchMixin, admin.ModelAdmin):
    """Runs are written by workers and pruned by them: nothing is added, changed or deleted
    here."""

    list_display = ["name", "queue", "state", "arguments_short", "attempt", "runtime_display",
                    "wait_display", "finished_at_display"]
    list_filter = [RunStateFilter, RunQueueFilter, RunTagFilter, "finished_at"]
    search_fields = ["name", "arguments", "error"]
    search_help_text = _('A job id or a job name (looked up at once); text in the names, '
                         'errors and arguments; or arguments as JSON by parameter name: '
                         'customer_id=9 kwargs__invoice_id=7 args__0="abc"')
    arguments_field = "arguments"
    argument_columns = ("arguments_short",)
    argument_fields = ("arguments_pretty",)
    argument_search_fields = ("arguments",)
    fields = readonly_fields = (
        "job_id", "name", "queue", "state", "attempt", "worker", "started_at", "finished_at",
        "runtime", "wait", "result_size", "tags_display", "arguments_pretty", "error_pretty")
    list_per_page = 50
    show_full_result_count = False  # no COUNT(*) over a million rows per page view
    paginator = EstimatedCountPaginator

    finished_at_display = timestamp_column("finished_at", _("finished at"))
    tags_display = tags_display

    def get_search_results(self, request: HttpRequest, queryset: Any, search_term: str):
        """A job id (a UUID) finds that job's runs, a job name with runs its runs, each by an
        index; anything else is searched as text (names, errors, arguments: a scan)."""
        term = (search_term or "").strip()
        if term and " " not in term and "=" not in term:
            try:
                return queryset.filter(job_id=uuid.UUID(term)), False
            except ValueError:
                pass
            if FinishedRun.objects.using(queryset.db).filter(name=term).exists():
                return queryset.filter(name=term), False
        return super().get_search_results(request, queryset, search_term)

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
