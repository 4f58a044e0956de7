"""The admin's dashboard: one page that says whether the queues are healthy.

Per queue: waiting, delayed and running jobs, failures of the last hour, the oldest waiting
job's age, jobs per minute done and failed over 1 h and 24 h as inline SVG charts (rendered
here, no JavaScript), paused and unserved flags with Pause / Resume buttons; the live workers;
held locks and open circuits per store with links to their pages. Everything comes from
:func:`django_jobguard.operations.monitoring.overview`, which ``GET stats/history/`` serves
too.

Registered on the :class:`~django_jobguard.models.Dashboard` proxy model to get its place at
the top of the app's section. Seeing it needs the queued jobs' view permission; pausing and
resuming need ``change_pausedqueue``, as on the paused queues page.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.core.serializers.json import DjangoJSONEncoder
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
    JsonResponse,
)
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from django_jobguard import history, operations, slo
from django_jobguard.models import Dashboard
from django_jobguard.operations import monitoring

VIEW_PERMISSION = "django_jobguard.view_queuedjob"
PAUSE_PERMISSION = "django_jobguard.change_pausedqueue"

#: Chart size in SVG units (the SVG scales to its box's width).
CHART_WIDTH, CHART_HEIGHT, CHART_PAD = 420, 110, 24


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    if seconds < 86400:
        return f"{seconds // 3600} h {seconds % 3600 // 60} min"
    return f"{seconds // 86400} d {seconds % 86400 // 3600} h"


def _seconds(value: float | None) -> str:
    """A runtime or wait for the statistics table: ``0.012 s``, ``3.4 s``, ``12 min 5 s``."""
    if value is None:
        return "-"
    if value < 10:
        return f"{value:.3g} s"
    return _duration(value)


def _points(values: list[float], top: float) -> str:
    """SVG polyline points for ``values`` scaled to the chart (``top`` at the top edge)."""
    inner_w, inner_h = CHART_WIDTH - 2 * CHART_PAD, CHART_HEIGHT - 2 * CHART_PAD
    step = inner_w / max(len(values) - 1, 1)
    return " ".join(f"{CHART_PAD + i * step:.1f},{CHART_PAD + inner_h - v / top * inner_h:.1f}"
                    for i, v in enumerate(values))


def chart(title: str, done: list[float], failed: list[float], *, span: str) -> SafeString:
    """A line chart of jobs/min done (green) and failed (red), as inline SVG."""
    top = max([*done, *failed, 1.0])
    bottom = CHART_HEIGHT - CHART_PAD
    grid = format_html_join("", '<line x1="{}" x2="{}" y1="{}" y2="{}" class="grid"/>', (
        (CHART_PAD, CHART_WIDTH - CHART_PAD, y, y)
        for y in (CHART_PAD, CHART_PAD + (bottom - CHART_PAD) / 2, bottom)))
    return format_html(
        '<svg class="jobguard-chart" viewBox="0 0 {w} {h}" role="img" '
        'aria-label="{title}">'
        '<title>{title}</title>{grid}'
        '<text x="{pad}" y="{ty}" class="label">{title}</text>'
        '<text x="{right}" y="{ty}" class="label" text-anchor="end">max {top}/min</text>'
        '<polyline class="done" points="{done}"/>'
        '<polyline class="failed" points="{failed}"/>'
        '<text x="{pad}" y="{by}" class="label">{span} ago</text>'
        '<text x="{right}" y="{by}" class="label" text-anchor="end">now</text></svg>',
        w=CHART_WIDTH, h=CHART_HEIGHT, pad=CHART_PAD, right=CHART_WIDTH - CHART_PAD,
        ty=CHART_PAD - 8, by=CHART_HEIGHT - 6, title=title, grid=grid,
        top=f"{top:.3g}", done=_points(done, top), failed=_points(failed, top), span=span)


def live_summary() -> dict[str, Any]:
    """The queues (counts, flags, latency, workers needed, breached objectives), the live
    workers and the stores as :func:`monitoring.overview` has them, the per-minute totals, and
    ``version``: a hash of everything but the ages and the time."""
    data = monitoring.overview()
    loads = slo.measure(counts=data["queues"])
    queues = {}
    for name, counts in data["queues"].items():
        load = loads.get(name)
        queues[name] = {
            **{key: counts.get(key) for key in (
                "waiting", "delayed", "reserved", "failed", "estimated", "done_last_hour",
                "failed_last_hour", "paused", "unserved", "oldest_waiting_seconds")},
            "recommended_workers": load.recommended_workers if load else 0,
            "breached": list(load.breached) if load else [],
        }
    workers = [{"id": w["id"], "queues": w["queues"], "current_job": w["current_job"],
                "jobs_processed": w["jobs_processed"]} for w in data["workers"]]
    stores = [{key: entry[key] for key in ("store", "held_locks", "open_circuits", "error")}
              for entry in data["stores"]]
    steady = {"queues": {name: {k: v for k, v in q.items() if k != "oldest_waiting_seconds"}
                         for name, q in queues.items()},
              "workers": workers, "stores": stores,
              "minute": [data["done_last_minute"], data["failed_last_minute"]]}
    version = hashlib.sha256(json.dumps(steady, sort_keys=True, cls=DjangoJSONEncoder)
                             .encode()).hexdigest()[:16]
    return {"version": version, "generated_at": data["generated_at"], "queues": queues,
            "workers": workers, "stores": stores,
            "done_last_minute": data["done_last_minute"],
            "failed_last_minute": data["failed_last_minute"]}


@admin.register(Dashboard)
class DashboardAdmin(admin.ModelAdmin):
    """The dashboard page and its Pause / Resume actions (no model rows of its own)."""

    template_name = "admin/django_jobguard/dashboard.html"

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(VIEW_PERMISSION)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self):
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        wrap = self.admin_site.admin_view
        return [
            path("", wrap(self.dashboard_view), name=f"{prefix}_changelist"),
            path("pause/", wrap(self.pause_view), name=f"{prefix}_pause"),
            path("resume/", wrap(self.resume_view), name=f"{prefix}_resume"),
            path("live.json", wrap(self.live_view), name=f"{prefix}_live"),
        ]

    def _url(self, name: str) -> str:
        return reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_{name}",
                       current_app=self.admin_site.name)

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        data = monitoring.overview()
        loads = slo.measure(counts=data["queues"])
        targets = slo.objectives()
        charts = data["history"]
        queues = []
        for name, counts in data["queues"].items():
            rows = {window: charts[window]["queues"].get(name) for window in ("1h", "24h")}
            load = loads.get(name)
            queues.append({
                "name": name, **counts,
                "breached": list(load.breached) if load else [],
                "recommended_workers": load.recommended_workers if load else 0,
                "objectives": ", ".join(
                    f"{key} {_duration(value) if key == 'max_wait' else f'{value:.0%}'}"
                    for key, value in targets.get(name, {}).items()),
                "oldest_waiting": _duration(counts["oldest_waiting_seconds"]),
                "failed_url": self._admin_url("failedjob", {"queue": name}),
                "queued_url": self._admin_url("queuedjob", {"queue": name}),
                "charts": [chart(f"{name}: jobs/min, last {label}",
                                 row["done"] if row else [0.0] * points,
                                 row["failed"] if row else [0.0] * points, span=label)
                           for label, row, points in (
                               ("1 h", rows["1h"], 60), ("24 h", rows["24h"], 24))],
            })
        stores = [{**entry, "locks_url": self._admin_url("lock", {"store": entry["store"]}),
                   "throttles_url": self._admin_url("throttle", {"store": entry["store"]})}
                  for entry in data["stores"]]
        workers = [{**worker, "heartbeat": _duration(worker["seconds_since_heartbeat"])}
                   for worker in data["workers"]]
        context = {
            **self.admin_site.each_context(request),
            **self._classes(request),
            "opts": self.opts,
            "title": _("Job queue dashboard"),
            "data": data,
            "queues": queues,
            "workers": workers,
            "stores": stores,
            "unserved": [q["name"] for q in queues if q["unserved"]],
            "breached": [(q["name"], name) for q in queues for name in q["breached"]],
            "exact_up_to": monitoring.EXACT_UP_TO,
            "can_pause": request.user.has_perm(PAUSE_PERMISSION),
            "pause_url": self._url("pause"),
            "resume_url": self._url("resume"),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, self.template_name, context)

    def live_view(self, request: HttpRequest) -> HttpResponse:
        """``live.json``: what the live pages poll (``static/django_jobguard/live.js``): the
        dashboard's figures without its charts, and a ``version`` that changes when a count
        does (not when only the ages move), so a list refreshes only when something changed."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        return JsonResponse(live_summary(), encoder=DjangoJSONEncoder)

    def _classes(self, request: HttpRequest) -> dict[str, Any]:
        """The per-job-class statistics of the finished-run history (``?window=`` 1h, 24h or
        7d; ``?sort=failures`` puts the most failing first, else the slowest p95 first)."""
        if history.history_mode() == "off":
            return {"history_on": False}
        window = request.GET.get("window", "24h")
        if window not in history.WINDOWS:
            self.message_user(request, _("Unknown window %(w)r: one of 1h, 24h, 7d; showing "
                                         "24h.") % {"w": window}, messages.ERROR)
            window = "24h"
        sort = "failures" if request.GET.get("sort") == "failures" else "slowest"
        rows = history.run_statistics(window)
        if sort == "failures":
            rows.sort(key=lambda r: (-r["failures"], -r["runs"], r["name"], r["queue"]))
        classes = [{
            **row,
            "runtime": " / ".join(_seconds(row[f"runtime_{k}"]) for k in ("p50", "p95", "max")),
            "wait": " / ".join(_seconds(row[f"wait_{k}"]) for k in ("p50", "p95", "max")),
            "runs_url": self._admin_url("finishedrun", {"name": row["name"],
                                                        "queue__exact": row["queue"]}),
            "failures_url": self._admin_url("finishedrun", {
                "name": row["name"], "queue__exact": row["queue"], "state__exact": "FAILED"}),
        } for row in rows]
        return {"history_on": True, "classes": classes, "window": window, "sort": sort,
                "windows": list(history.WINDOWS)}

    def _admin_url(self, model: str, query: dict[str, str]) -> str:
        url = reverse(f"admin:{self.opts.app_label}_{model}_changelist",
                      current_app=self.admin_site.name)
        return f"{url}?{urlencode(query)}"

    def _queue_action(self, request: HttpRequest, act: str) -> HttpResponse:
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not request.user.has_perm(PAUSE_PERMISSION):
            raise PermissionDenied
        name = request.POST.get("queue", "")
        actor = request.user.get_username()
        try:
            if act == "pause":
                if operations.pause(name, actor=actor, force_hint=""):
                    self.message_user(request, _("Paused queue %(q)s: workers claim none of "
                                                 "its jobs until it is resumed; running jobs "
                                                 "finish.") % {"q": name}, messages.SUCCESS)
                else:
                    self.message_user(request, _("Queue %(q)s was paused already.")
                                      % {"q": name}, messages.WARNING)
            else:
                operations.resume(name, actor=actor)
                self.message_user(request, _("Resumed queue %(q)s.") % {"q": name},
                                  messages.SUCCESS)
        except operations.QueueNameError as exc:
            self.message_user(request, str(exc), messages.ERROR)
        return HttpResponseRedirect(self._url("changelist"))

    def pause_view(self, request: HttpRequest) -> HttpResponse:
        return self._queue_action(request, "pause")

    def resume_view(self, request: HttpRequest) -> HttpResponse:
        return self._queue_action(request, "resume")
