from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class JobGuardConfig(AppConfig):
    name = "django_jobguard"
    label = "django_jobguard"
    verbose_name = _("Job queue")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_jobguard import checks, registry  # noqa: F401  (registers the checks)

        registry.autodiscover()
        from django.conf import settings

        tasks = getattr(settings, "TASKS", {})
        if isinstance(tasks, dict) and any(
            str(config.get("BACKEND", "")).startswith("django_jobguard.")
            for config in tasks.values() if isinstance(config, dict)
        ):
            import django_jobguard.tasks_backend  # noqa: F401  (registers the task adapter jobs)
