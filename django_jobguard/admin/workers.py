"""Workers, each with its verdict: alive, or gone (and why)."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe
from django.utils.translation import gettext_lazy as _

from django_jobguard import operations
from django_jobguard.admin.base import ReadOnlyDetailMixin, timestamp_column
from django_jobguard.models import Worker


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

    started_at_display = timestamp_column("started_at", _("started at"))
    last_seen_at_display = timestamp_column("last_seen_at", _("last heartbeat"))

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
