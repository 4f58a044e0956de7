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
