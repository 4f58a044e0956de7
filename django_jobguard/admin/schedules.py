"""Periodic schedules: each tick recorded, with the schedules' last and next runs."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest
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
        context = {"schedules": schedules.schedule_status(), **(extra_context or {})}
        return super().changelist_view(request, extra_context=context)
