from django.contrib import admin
from django.urls import include, path

urlpatterns = [path("admin/", admin.site.urls)]

try:
    import django_jobguard.api.urls  # noqa: F401  (needs the "api" extra)
except ImportError:
    pass
else:
    urlpatterns.append(path("jobguard/api/", include("django_jobguard.api.urls")))
