"""A throwaway Django project for pytester runs (the pytest plugin, the docs' examples)."""

from __future__ import annotations

SETTINGS = """
SECRET_KEY = "throwaway"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_jobguard",
                  "shop"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "shop.sqlite3"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
"""


def run_project(pytester, files: dict[str, str]):
    """Write ``files`` (path → text) beside the settings and an empty ``shop`` app, run pytest
    there in a subprocess (the plugin comes from its entry point: no conftest) and return the
    result."""
    pytester.makepyfile(**{"shop/__init__.py": "", "throwaway_settings.py": SETTINGS,
                           **{path.removesuffix(".py"): text for path, text in files.items()}})
    pytester.makeini("[pytest]\npythonpath = .\n")
    assert not list(pytester.path.rglob("conftest.py"))
    # --ds: this run's own DJANGO_SETTINGS_MODULE is in the environment the subprocess gets.
    return pytester.runpytest_subprocess("--ds=throwaway_settings", "-p", "no:randomly",
                                         "-p", "no:cacheprovider")


def make_project(where, jobs: str = "") -> None:
    """A fresh project in the directory ``where``, as a new user has one: the settings above
    (no ``LOGGING``, an SQLite file not migrated yet) and a ``shop`` app with ``jobs``."""
    (where / "shop").mkdir()
    (where / "shop" / "__init__.py").write_text("")
    (where / "shop" / "jobs.py").write_text(jobs)
    (where / "throwaway_settings.py").write_text(SETTINGS)


def run_in(where, *args: str):
    """``python <args>`` in the project at ``where`` (a ``subprocess.CompletedProcess``)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(where), "DJANGO_SETTINGS_MODULE": "throwaway_settings"}
    return subprocess.run([sys.executable, *args], cwd=where, env=env, capture_output=True,
                          text=True, timeout=120)
