"""Workers, each with its verdict (alive, or gone and why), what it runs (the job's class and
id), and the actions quiet and stop (delivered through its row, see
:func:`~django_jobguard.operations.workers.command_worker`)."""

from __future__ import annotations

from django.contrib import admin, messages
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from django_jobguard import operations
from django_jobguard.admin.base import ReadOnlyDetailMixin, timestamp_column
from django_jobguard.models import QUIET, STOP, Worker


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
    fields = readonly_fields = (
        "id", "status_display", "hostname", "pid", "queues", "current_job_display",
        "jobs_processed", "done_last_minute", "failed_last_minute", "started_at",
        "last_seen_at", "state", "command", "command_by", "command_at")
    actions = ["quiet_workers", "stop_workers"]

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
            running = operations.running_jobs([row for row in cl.result_list], using=cl.queryset.db)
            for row in cl.result_list:
                row.jobguard_status = states.get(row.id, "unknown")
                row.jobguard_running = running
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
        """Each running job's class (as operators know it) and the start of its id."""
        ids = [job_id for job_id in obj.current_job.split(",") if job_id]
        if not ids:
            return "-"
        names = getattr(obj, "jobguard_running", None)
        if names is None:  # the detail page: this worker alone
            names = operations.running_jobs([obj])
        return format_html_join(mark_safe("<br>"), '{} <code title="{}">{}…</code>', (
            (names.get(job_id, _("(finished)")), job_id, job_id[:8]) for job_id in ids))

    @admin.display(description=_("last minute: done / failed"))
    def last_minute(self, obj: Worker) -> str:
        return f"{obj.done_last_minute} / {obj.failed_last_minute}"

    @admin.display(description=_("status"))
    def status_display(self, obj: Worker) -> str:
        status = getattr(obj, "jobguard_status", None) or operations.worker_states(
            [obj.id]).get(obj.id, "unknown")
        if status != "alive":
            return format_html('<strong class="jobguard-stale">{}</strong>', _GONE[status])
        asked = _WORKER_STATES.get(obj.state, "") if obj.state != "running" else ""
        if not asked and obj.command:  # asked, not seen yet (within one heartbeat)
            asked = _ASKED[obj.command]
        if asked:
            return format_html('<span class="jobguard-alive">{}</span>, <strong title="{}">'
                               '{}</strong>', _("alive"), _("asked by %(who)s") % {
                                   "who": obj.command_by or _("an operator")}, asked)
        return format_html('<span class="jobguard-alive">{}</span>', _("alive"))

    # -- quiet and stop -------------------------------------------------------------------

    def has_quiet_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_jobguard.quiet_worker")

    def has_stop_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_jobguard.stop_worker")

    @admin.action(description=_("Quiet selected workers (claim nothing new, finish running "
                                "jobs)"), permissions=["quiet"])
    def quiet_workers(self, request: HttpRequest, queryset) -> None:
        self._command(request, queryset, QUIET)

    @admin.action(description=_("Stop selected workers (running jobs finish, then they exit)"),
                  permissions=["stop"])
    def stop_workers(self, request: HttpRequest, queryset) -> None:
        self._command(request, queryset, STOP)

    def _command(self, request: HttpRequest, queryset, command: str) -> None:
        done, stopping, gone = 0, 0, []
        for worker_id in queryset.values_list("id", flat=True):
            try:
                now = operations.command_worker(worker_id, command,
                                                actor=request.user.get_username(),
                                                using=queryset.db)
            except (operations.WorkerNotFound, operations.WorkerGoneError):
                gone.append(worker_id)
                continue
            done += now == command
            stopping += now != command
        if done:
            self.message_user(request, (ngettext(
                "%(n)d worker was asked to quiet; it claims nothing new from its next "
                "heartbeat.", "%(n)d workers were asked to quiet; they claim nothing new from "
                "their next heartbeat.", done) if command == QUIET else ngettext(
                "%(n)d worker was asked to stop; it exits once its running jobs finish.",
                "%(n)d workers were asked to stop; they exit once their running jobs finish.",
                done)) % {"n": done}, messages.SUCCESS)
        if stopping:
            self.message_user(request, ngettext(
                "%(n)d worker is stopping already.", "%(n)d workers are stopping already.",
                stopping) % {"n": stopping}, messages.WARNING)
        if gone:
            self.message_user(request, _("Gone, left alone: %(ids)s.") % {
                "ids": ", ".join(gone)}, messages.WARNING)


#: What a worker's row says it does, and what was asked of it but not seen yet.
_WORKER_STATES = {"quiet": _("quiet"), "stopping": _("stopping")}
_ASKED = {QUIET: _("quiet asked"), STOP: _("stop asked")}
