"""Who may use the API: ``JOBGUARD['API_PERMISSION_CLASSES']`` (default
:class:`JobGuardAdminPermissions`: staff *and* the model permissions the admin asks for).

The dotted paths are resolved on each request, so ``override_settings`` and settings loaded
after import both work. :class:`JobGuardModelPermissions` asks for the model permissions
without staff status.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string
from rest_framework.permissions import BasePermission

from django_jobguard.conf import jobguard_settings


def api_permission_classes() -> list[type[BasePermission]]:
    """The configured permission classes, imported."""
    classes = []
    for entry in jobguard_settings.API_PERMISSION_CLASSES:
        if not isinstance(entry, str):
            classes.append(entry)
            continue
        try:
            classes.append(import_string(entry))
        except ImportError as exc:
            raise ImproperlyConfigured(
                f"JOBGUARD['API_PERMISSION_CLASSES'] names {entry!r}, which cannot be "
                f"imported: {exc}") from exc
    return classes


class JobGuardModelPermissions(BasePermission):
    """Allow a request when the user has the model permissions its view declares.

    Each view has ``model_permissions``: HTTP method → permission codenames, e.g.
    ``{"GET": ["view_lock"], "DELETE": ["change_lock"]}``, and a viewset may name other ones
    for some of its actions in ``action_permissions`` (``{"forget_matching": {"POST":
    ["delete_failedjob"]}}``); a method the view handles but does not list is refused, one
    it does not handle goes on to its 405.
    """

    def has_permission(self, request: Any, view: Any) -> bool:
        user = request.user
        if not (user and user.is_authenticated):
            return False
        method = "GET" if request.method in ("HEAD", "OPTIONS") else request.method
        if getattr(view, method.lower(), None) is None:
            return True  # no handler: the 405 that follows touches nothing
        permissions = getattr(view, "action_permissions", {}).get(
            getattr(view, "action", None)) or getattr(view, "model_permissions", {})
        needed = permissions.get(method)
        if needed is None:
            return False
        return user.has_perms([f"django_jobguard.{codename}" for codename in needed])


class JobGuardAdminPermissions(JobGuardModelPermissions):
    """What the admin asks: an active staff user holding the view's model permissions
    (a superuser holds them all), so a staff user with no permissions can do nothing."""

    def has_permission(self, request: Any, view: Any) -> bool:
        user = request.user
        if not (user and user.is_authenticated and user.is_active and user.is_staff):
            return False
        return super().has_permission(request, view)
