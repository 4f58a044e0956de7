from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


def _run_inline(sender: Any, *, job_ids: Sequence[str], using: str, **kwargs: Any) -> None:
    """In inline test mode, run the rows a dispatch just inserted (testing/inline_mode); the
    testing package is imported only then."""
    from django_jobguard.conf import jobguard_settings

    if jobguard_settings.TEST_MODE == "inline":
        from django_jobguard.testing.inline_mode import run_inline

        run_inline(job_ids, using=using)


class JobGuardConfig(AppConfig):
    name = "django_jobguard"
    label = "django_jobguard"
    verbose_name = _("Job queue")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_jobguard import checks, models, registry, signals  # noqa: F401  (checks)

        signals.jobs_inserted.connect(_run_inline, dispatch_uid="jobguard.inline_mode")
        models.display_name = registry.display_name  # str() of rows names a task's own path
        registry.autodiscover()
        from django.conf import settings

        from django_jobguard.conf import jobguard_settings

        if jobguard_settings.EMBEDDED_WORKER:  # worker threads in the web server (embedded.py)
            from django.core.signals import request_started

            from django_jobguard.worker import embedded

            request_started.connect(embedded.on_request_started,
                                    dispatch_uid="jobguard.embedded_worker")

        tasks = getattr(settings, "TASKS", {})
        if isinstance(tasks, dict) and any(
            str(config.get("BACKEND", "")).startswith("django_jobguard.")
            for config in tasks.values() if isinstance(config, dict)
        ):
            import django_jobguard.tasks_backend  # noqa: F401  (registers the task adapter jobs)
