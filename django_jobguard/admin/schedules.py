"""Periodic schedules: each tick recorded, with the schedules' last and next runs, and a
"Run now" button per schedule (:func:`~django_jobguard.schedules.run_now`)."""

from __future__ import annotations

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import path, reverse
from django.utils.translation import gettext_lazy as _

from django_jobguard import schedules
from django_jobguard.admin.base import ReadOnlyDetailMixin, timestamp_column
from django_jobguard.models import ScheduleTick


@admin.register(ScheduleTick)
class ScheduleTickAdmin(ReadOnlyDetailMixin, admin.ModelAdmin):
    """Each periodic tick recorded, with the schedules' last and next runs above the list."""

    change_list_template = "admin/django_jobguard/schedule_runs.html"
    list_display = ["schedule", "tick_display", "job_id", "skipped", "enqueued_at_display"]
    list_filter = ["schedule", "skipped"]
    search_fields = ["schedule", "job_id"]
    readonly_fields = [f.name for f in ScheduleTick._meta.fields]
    tick_display = timestamp_column("tick", _("tick"))
    enqueued_at_display = timestamp_column("enqueued_at", _("enqueued at"))

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None):
        context = {"schedules": schedules.schedule_status(),
                   "can_run_now": self.has_run_permission(request), **(extra_context or {})}
        return super().changelist_view(request, extra_context=context)

    def has_run_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_jobguard.run_schedule")

    def get_urls(self):
        info = self.opts.app_label, self.opts.model_name
        return [path("run-now/<path:name>/", self.admin_site.admin_view(self.run_now_view),
                     name=f"{info[0]}_{info[1]}_run_now"), *super().get_urls()]

    def run_now_view(self, request: HttpRequest, name: str) -> HttpResponse:
        """A schedule's Run now button (POST, needs ``run_schedule``): one run of its job
        now; the ticks go on as before."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_run_permission(request):
            raise PermissionDenied
        changelist = reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_changelist",
                             current_app=self.admin_site.name)
        try:
            result = schedules.run_now(name, actor=request.user.get_username())
        except (schedules.UnknownScheduleError, schedules.ScheduleError) as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return HttpResponseRedirect(changelist)
        if result:
            self.message_user(request, _("Schedule %(name)s: job %(id)s queued now; its next "
                                         "tick runs as planned.") % {
                                             "name": name, "id": result.id}, messages.SUCCESS)
        else:
            self.message_user(request, _("Schedule %(name)s: not queued, a copy of the unique "
                                         "job is queued already.") % {"name": name},
                              messages.WARNING)
        return HttpResponseRedirect(changelist)
