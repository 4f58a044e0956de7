from django.contrib import admin
from django.urls import include, path

urlpatterns = [path("admin/", admin.site.urls)]

try:
    import django_jobguard.api.urls  # noqa: F401  (needs the "api" extra)
except ImportError:
    pass
else:
    urlpatterns.append(path("jobguard/api/", include("django_jobguard.api.urls")))

try:
    import prometheus_client  # noqa: F401  (needs the "metrics" extra)
except ImportError:
    pass
else:
    urlpatterns.append(path("jobguard/metrics/", include("django_jobguard.metrics.urls")))
