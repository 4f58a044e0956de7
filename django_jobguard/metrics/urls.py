"""``path("jobguard/metrics/", include("django_jobguard.metrics.urls"))``."""

from django.urls import path

from django_jobguard.metrics import views

app_name = "jobguard_metrics"
urlpatterns = [path("", views.metrics, name="metrics")]
