from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "demo"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import scenario_jobs  # noqa: F401  (registers the jobguard_demo jobs)
