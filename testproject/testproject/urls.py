from importlib.util import find_spec

from django.contrib import admin
from django.urls import include, path

urlpatterns = [path("admin/", admin.site.urls)]

if find_spec("rest_framework") and find_spec("django_jobguard.api.urls"):
    urlpatterns.append(path("jobguard/api/", include("django_jobguard.api.urls")))
