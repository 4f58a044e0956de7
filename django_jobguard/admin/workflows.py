"""Chains (each link's status) and batches (counts, progress, callbacks, cancel)."""

from __future__ import annotations

from django.contrib import admin, messages
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from django_jobguard.admin.base import Label, ReadOnlyDetailMixin, timestamp_column
from django_jobguard.models import Batch, Chain
from django_jobguard.workflows import batches


@admin.register(Chain)
class ChainAdmin(ReadOnlyDetailMixin, admin.ModelAdmin):
    """Chains with each link's status (a failed link's job is retried from failed jobs)."""

    list_display = ["__str__", "status", "progress", "created_at_display", "finished_at_display"]
    list_filter = ["status"]
    search_fields = ["id", "name"]
    fields = readonly_fields = ("id", "name", "status", "link_table", "created_at", "finished_at")
    created_at_display = timestamp_column("created_at", _("created at"))
    finished_at_display = timestamp_column("finished_at", _("finished at"))

    @staticmethod
    def _links(obj: Chain) -> list[dict] | None:
        """The chain's links, or ``None`` when the stored value is not a list of objects
        (bad stored data: the page says so instead of failing)."""
        links = obj.links
        if isinstance(links, list) and all(isinstance(link, dict) for link in links):
            return links
        return None

    @admin.display(description=_("links done"))
    def progress(self, obj: Chain) -> Label:
        links = self._links(obj)
        if links is None:
            return _("unreadable links")
        done = sum(link.get("status") == "done" for link in links)
        return f"{done} / {len(links)}"

    @admin.display(description=_("links"))
    def link_table(self, obj: Chain) -> str:

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
                    "failed_jobs", "created_at_display", "finished_at_display"]
    list_filter = [("finished_at", admin.EmptyFieldListFilter),
                   ("cancelled_at", admin.EmptyFieldListFilter)]
    search_fields = ["id", "name"]
    fields = readonly_fields = (
        "id", "name", "status", "progress_bar", "total_jobs", "pending_jobs", "failed_jobs",
        "failed_job_ids", "allow_failures", "callback_list", "callbacks_queued", "created_at",
        "cancelled_at", "finished_at")
    actions = ["cancel_batches"]

    @admin.display(description=_("status"))
    def status(self, obj: Batch) -> str:
        return obj.status

    created_at_display = timestamp_column("created_at", _("created at"))
    finished_at_display = timestamp_column("finished_at", _("finished at"))

    @admin.display(description=_("progress"))
    def progress_bar(self, obj: Batch) -> str:
        """A bar of the jobs that succeeded (green) and failed (red) out of the total, so a
        batch that ran every job but failed some never looks like a completed one; the
        status is written beside the counts."""
        total = obj.total_jobs or 1
        failed = min(obj.failed_jobs, obj.total_jobs)
        succeeded = max(obj.processed_jobs - failed, 0)
        ok_share, failed_share = 100 * succeeded / total, 100 * failed / total
        summary = _("%(done)s / %(total)s, %(failed)s failed") % {
            "done": obj.processed_jobs, "total": obj.total_jobs, "failed": failed} if failed \
            else _("%(done)s / %(total)s") % {"done": obj.processed_jobs, "total": obj.total_jobs}
        return format_html(
            '<span class="jobguard-batch-bar jobguard-batch-{status}" role="img" '
            'aria-label="{summary} ({status})" title="{summary} ({status})">'
            '<span class="ok" style="width: {ok}%"></span>'
            '<span class="failed" style="width: {bad}%"></span></span> {summary}',
            status=obj.status, summary=summary, ok=f"{ok_share:.1f}", bad=f"{failed_share:.1f}")

    @admin.display(description=_("callbacks"))
    def callback_list(self, obj: Batch) -> str:

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
