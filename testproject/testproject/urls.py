from importlib.util import find_spec

from django.contrib import admin
from django.urls import include, path

urlpatterns = [path("admin/", admin.site.urls)]

# find_spec of a submodule raises when its parent package is missing, so check both.
if find_spec("rest_framework") and find_spec("django_jobguard.api") and find_spec(
        "django_jobguard.api.urls"):
    urlpatterns.append(path("jobguard/api/", include("django_jobguard.api.urls")))
