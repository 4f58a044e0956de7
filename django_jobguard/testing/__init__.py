"""Helpers for testing code that dispatches jobs (see docs/testing.md).

``capture()`` records what was dispatched, ``assert_dispatched()`` / ``assert_not_dispatched()``
/ ``dispatched()`` look at the active capture, ``drain()`` runs the queued jobs in this process
through the worker's pipeline, ``inline()`` runs each dispatch at once, ``clock()`` moves
"now" forward for the queue and the stores, ``isolated_stores()`` undoes what a block wrote
to the Redis stores (the plugin does it for every test). The pytest fixtures (``jobguard_capture``,
``jobguard_drain``, ``jobguard_inline``, ``jobguard_clock``) come from the plugin in
:mod:`django_jobguard.testing.pytest_plugin`, which pytest loads by itself.

Imports are lazy, so that importing this package works before Django is set up.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "Capture": "django_jobguard.testing.recording",
    "CapturedJob": "django_jobguard.testing.recording",
    "CaptureMixin": "django_jobguard.testing.recording",
    "capture": "django_jobguard.testing.recording",
    "assert_dispatched": "django_jobguard.testing.recording",
    "assert_not_dispatched": "django_jobguard.testing.recording",
    "dispatched": "django_jobguard.testing.recording",
    "DrainResult": "django_jobguard.testing.draining",
    "DrainError": "django_jobguard.testing.draining",
    "drain": "django_jobguard.testing.draining",
    "inline": "django_jobguard.testing.inline_mode",
    "run_on_commit_callbacks": "django_jobguard.testing.commits",
    "TestClock": "django_jobguard.testing.time_travel",
    "clock": "django_jobguard.testing.time_travel",
    "isolated_stores": "django_jobguard.stores.journal",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'django_jobguard.testing' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
