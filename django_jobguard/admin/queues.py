"""Paused queues: "add" pauses a queue (its name checked as ``jobs_pause`` checks it),
the "Resume" action resumes."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from django_jobguard import operations
from django_jobguard.admin.base import timestamp_column
from django_jobguard.models import PausedQueue


class PauseQueueForm(forms.ModelForm):
    """Pause a queue: its name, checked as ``jobs_pause`` checks it."""

    force = forms.BooleanField(required=False, label=_("Pause even if nothing uses it yet"))

    class Meta:
        model = PausedQueue
        fields = ["queue"]

    def clean(self):
        data = super().clean()
        assert data is not None  # ModelForm.clean() returns cleaned_data
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
    list_display = ["queue", "paused_at_display", "paused_by"]
    paused_at_display = timestamp_column("paused_at", _("paused at"))
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
