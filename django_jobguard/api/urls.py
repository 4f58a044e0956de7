"""``path("jobguard/api/", include("django_jobguard.api.urls"))``.

Lock and throttle keys contain ``:`` and ``.`` (``jobguard:unique:demo.jobs.Sync:7``), so
their routes use the ``path`` converter, which takes any non-empty text.
"""

from django.urls import path, re_path
from rest_framework.routers import SimpleRouter

from django_jobguard.api import views

app_name = "jobguard-api"

router = SimpleRouter()
router.register("jobs", views.QueuedJobViewSet, basename="job")
router.register("failed-jobs", views.FailedJobViewSet, basename="failed-job")
router.register("batches", views.BatchViewSet, basename="batch")
router.register("runs", views.FinishedRunViewSet, basename="run")
router.register("workers", views.WorkerViewSet, basename="worker")

endpoint_patterns = [
    *router.urls,
    path("locks/", views.LockListView.as_view(), name="lock-list"),
    path("locks/<path:key>/", views.LockDetailView.as_view(), name="lock-detail"),
    path("throttles/", views.ThrottleListView.as_view(), name="throttle-list"),
    path("throttles/<path:key>/", views.ThrottleDetailView.as_view(), name="throttle-detail"),
    path("queues/paused/", views.PausedQueueListView.as_view(), name="paused-queue-list"),
    path("queues/<str:queue>/pause/", views.PauseQueueView.as_view(), name="queue-pause"),
    path("queues/<str:queue>/resume/", views.ResumeQueueView.as_view(), name="queue-resume"),
    path("stats/", views.StatsView.as_view(), name="stats"),
    path("stats/history/", views.StatsHistoryView.as_view(), name="stats-history"),
    path("schedules/", views.ScheduleListView.as_view(), name="schedule-list"),
    path("schedules/<path:name>/run/", views.RunScheduleView.as_view(), name="schedule-run"),
    path("dispatch/", views.DispatchView.as_view(), name="dispatch"),
]

urlpatterns = list(endpoint_patterns)
if views.SchemaView is not None:
    urlpatterns.append(path("schema/", views.SchemaView.as_view(
        endpoint_patterns=endpoint_patterns), name="schema"))
# Anything else (also paths the converters refuse, such as keys with a newline): JSON 404.
urlpatterns.append(re_path(r"^[\s\S]*$", views.NotFoundView.as_view(), name="not-found"))
