"""Locks and throttles: admin pages that are views over the store, not model rows.

Locks and throttles may live in Redis, so their pages are views over the store API
(``Store.locks()`` / ``Store.throttles()``), registered on the ``Lock`` and ``Throttle``
models only to get a place in the admin, the model permissions and the URL names.
"""

from __future__ import annotations

import logging
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.http import urlencode
from django.utils.translation import gettext_lazy as _

from django_jobguard import operations
from django_jobguard.exceptions import StoreUnavailableError
from django_jobguard.models import Lock, Throttle

logger = logging.getLogger("django_jobguard.admin")


def _seconds_label(seconds: float | None, *, none: str) -> str:
    """``never`` / ``42 s`` / ``3 min 5 s`` / ``2 h 10 min`` / ``expired 4 s ago``."""
    if seconds is None:
        return none
    if seconds <= 0:
        return f"expired {_duration(-seconds)} ago"
    return _duration(seconds)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


class StoreViewAdmin(admin.ModelAdmin):
    """Base for admin pages that show a store's contents instead of model rows.

    ``GET <changelist>?store=<alias>`` lists; ``POST <changelist>/<action>/`` with ``key``
    and ``store`` acts on one entry and needs the model's change permission.
    """

    template_name: str
    action_name: str  # the URL segment and view name of the POST action
    action_done: str  # message after a successful action, with {key}
    action_missing: str  # message when the key was not found

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self):
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path("", self.admin_site.admin_view(self.store_view), name=f"{prefix}_changelist"),
            path(f"{self.action_name}/", self.admin_site.admin_view(self.action_view),
                 name=f"{prefix}_{self.action_name}"),
        ]

    def rows(self, store) -> list:
        raise NotImplementedError

    def page(self, store, request: HttpRequest) -> tuple[list, dict]:
        """The rows to show and extra context (paging, filters); default: all rows."""
        return self.rows(store), {}

    def act(self, store, key: str, request: HttpRequest) -> bool:
        raise NotImplementedError

    def confirmation(self, store, key: str, request: HttpRequest) -> HttpResponse | None:
        """A page asking to confirm the action first, or None to act at once."""
        return None

    def _changelist_url(self, alias: str) -> str:
        url = reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_changelist",
                      current_app=self.admin_site.name)
        return f"{url}?{urlencode({'store': alias})}"

    def store_view(self, request: HttpRequest) -> TemplateResponse:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        aliases = operations.usable_stores()
        alias = request.GET.get("store") or (aliases[0] if aliases else "")
        rows: list = []
        error = ""
        extra: dict = {}
        try:
            store = operations.store_for(alias)
            rows, extra = self.page(store, request)
        except (operations.UnknownStoreError, ValueError) as exc:  # ValueError: a bad filter
            error = str(exc)
        except NotImplementedError:
            error = _("The store %(alias)s cannot list these entries yet.") % {"alias": alias}
        except StoreUnavailableError as outage:  # expected: one line, not a traceback
            logger.warning("Could not list store %s: it is unavailable (%s).", alias,
                           outage.error_line)
            error = _("Could not read the store %(alias)s: %(error)s") % {
                "alias": alias, "error": outage.error_line}
        except Exception as exc:  # a store that is down must not take the admin page with it
            logger.exception("Listing store %s failed.", alias)
            error = _("Could not read the store %(alias)s: %(error)s") % {
                "alias": alias, "error": exc}
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": str(self.opts.verbose_name_plural).capitalize(),
            "stores": aliases,
            "store": alias,
            "rows": rows,
            "error": error,
            "can_change": self.has_change_permission(request),
            "action_url": reverse(
                f"admin:{self.opts.app_label}_{self.opts.model_name}_{self.action_name}",
                current_app=self.admin_site.name),
            **extra,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, self.template_name, context)

    def action_view(self, request: HttpRequest) -> HttpResponse:
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_change_permission(request):
            raise PermissionDenied
        alias, key = request.POST.get("store", ""), request.POST.get("key", "")
        try:
            store = operations.store_for(alias)
        except operations.UnknownStoreError as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return HttpResponseRedirect(self._changelist_url(""))
        try:
            confirm = self.confirmation(store, key, request)
            if confirm is not None:
                return confirm
            done = bool(key) and self.act(store, key, request)
        except NotImplementedError:
            self.message_user(request, _("The store %(alias)s cannot do this yet.")
                              % {"alias": alias}, messages.ERROR)
        except StoreUnavailableError as outage:  # an error message, as the list shows one
            logger.warning("Could not %s %s: store %s is unavailable (%s).", self.action_name,
                           key, store.alias, outage.error_line)
            self.message_user(request, _("Could not reach the store %(alias)s: %(error)s")
                              % {"alias": store.alias, "error": outage.error_line},
                              messages.ERROR)
        else:
            if done:
                self.message_user(request, self.action_done.format(key=key), messages.SUCCESS)
            else:
                self.message_user(request, self.action_missing.format(key=key),
                                  messages.WARNING)
        return HttpResponseRedirect(self._changelist_url(store.alias))


@admin.register(Lock)
class LockAdmin(StoreViewAdmin):
    template_name = "admin/django_jobguard/locks.html"
    action_name = "release"
    action_done = "Released lock {key}."
    action_missing = "Lock {key} was not held (it may have been released meanwhile)."

    #: Locks on one page; a page reads only these (a keyset in SQL, SCAN in Redis).
    per_page = 100

    def page(self, store, request: HttpRequest) -> tuple[list, dict]:
        """One keyed page of locks, narrowed by ``?kind=`` and ``?q=`` (key prefix); the
        "next page" link carries the cursor. A key typed in full finds that lock at once."""
        kind = request.GET.get("kind") or None
        prefix, cursor = request.GET.get("q", "").strip(), request.GET.get("cursor", "")
        more = request.GET.get("more") == "1"
        query = {"store": store.alias, "kind": kind or "", "q": prefix}
        context = {"kinds": operations.LOCK_KINDS, "kind": kind or "", "q": prefix,
                   "paged": bool(cursor) or more, "first_url": "?" + urlencode(query),
                   "next_url": "", "more_url": ""}
        # A key typed in full is looked up directly: no page to read (on Redis that would
        # scan the keyspace for the prefix); the keys that merely start with it are a link.
        exact = operations.inspect_lock(store, prefix) if prefix and not (cursor or more) \
            else None
        if exact is not None:
            context["more_url"] = "?" + urlencode({**query, "more": "1"})
            return [self._row(exact)], context
        page = operations.lock_page(store, kind=kind, prefix=prefix, cursor=cursor,
                                    limit=self.per_page)
        if page.cursor:
            context["next_url"] = "?" + urlencode({**query, "cursor": page.cursor})
        return [self._row(row) for row in page.rows], context

    def _row(self, row: operations.LockRow) -> dict:
        return {
            "key": row.key, "kind": row.info.kind, "owner": row.info.owner,
            "token": row.info.token, "acquired_at": row.info.acquired_at,
            "expires": _seconds_label(row.expires_in, none="never"),
            "job_id": row.info.job_id, "stale": row.stale, "stale_reason": row.stale_reason,
        }

    def act(self, store, key: str, request: HttpRequest) -> bool:
        return operations.force_release(store, key, actor=request.user.get_username())

    def confirmation(self, store, key: str, request: HttpRequest) -> HttpResponse | None:
        """A lock whose job is still queued or running on a live worker (not stale) is
        released only after a confirmation; stale or job-less locks at once."""
        if request.POST.get("confirm") == "yes" or not key:
            return None
        row = operations.inspect_lock(store, key)
        if row is None or row.stale or not row.info.job_id:
            return None
        context = {**self.admin_site.each_context(request), "opts": self.opts,
                   "title": _("Force release"), "lock": row, "store": store.alias,
                   "back_url": self._changelist_url(store.alias),
                   "action_url": request.path}
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/django_jobguard/lock_release_confirmation.html",
                                context)


@admin.register(Throttle)
class ThrottleAdmin(StoreViewAdmin):
    template_name = "admin/django_jobguard/throttles.html"
    action_name = "reset"
    action_done = "Reset {key}."
    action_missing = "{key} had no state to reset."

    def rows(self, store) -> list:
        return [{
            "key": row.key, "kind": row.info.kind, "hits": row.info.hits,
            "limit": row.info.limit, "state": row.info.state or "closed",
            "resets_at": row.info.resets_at,
            "resets_in": "-" if row.resets_in is None else _duration(row.resets_in),
        } for row in operations.inspect_throttles(store)]

    def store_view(self, request: HttpRequest) -> TemplateResponse:
        response = super().store_view(request)
        context = response.context_data
        assert context is not None  # store_view() always renders with a context
        rows = context["rows"]
        context["windows"] = [r for r in rows if r["kind"] != "circuit"]
        context["circuits"] = [r for r in rows if r["kind"] == "circuit"]
        return response

    def act(self, store, key: str, request: HttpRequest) -> bool:
        return operations.reset_throttle(store, key, actor=request.user.get_username())
