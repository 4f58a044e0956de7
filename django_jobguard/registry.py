"""Job names → job classes. Workers look jobs up here; payloads never name an import path."""

from __future__ import annotations

import difflib
import inspect
from typing import TYPE_CHECKING, Any

from django.utils.module_loading import autodiscover_modules, import_string

if TYPE_CHECKING:
    from django_jobguard.context import JobLike


class UnknownJobError(LookupError):
    """A payload names a job that no loaded module registered."""


class IncompatibleJobError(UnknownJobError):
    """A job is registered under the row's name, but its constructor does not take the row's
    arguments: the row was queued by another version of the code (a rolling deploy). Handled
    as an unknown job: put back for ``UNKNOWN_JOB_GRACE`` so a worker that can rebuild it
    does."""


_registry: dict[str, type[JobLike]] = {}


def register(job_class: type[JobLike]) -> type[JobLike]:
    """Record ``job_class`` under its ``name``; a second class with the same name is an error."""
    name = job_class.name
    existing = _registry.get(name)
    if existing is not None and existing is not job_class:
        same_place = (existing.__module__, existing.__qualname__) == (
            job_class.__module__,
            job_class.__qualname__,
        )
        if not same_place:
            raise ValueError(
                f"Job name {name!r} is already used by {existing.__module__}."
                f"{existing.__qualname__}; set a distinct `name` on one of them."
            )
    _registry[name] = job_class
    return job_class


def get(name: str) -> type[JobLike]:
    """The class registered as ``name``, or :class:`UnknownJobError` with a readable message."""
    try:
        return _registry[name]
    except KeyError:
        raise UnknownJobError(
            f"No job is registered as {name!r}.{did_you_mean(name)} Was it renamed or removed? "
            f"Jobs register when their module is imported: put them in <app>/jobs.py or list "
            f"the module in JOBGUARD['JOB_MODULES']."
        ) from None


def similar(name: str) -> list[str]:
    """Up to two registered names that look like ``name``: the same class name in another
    module (a move), else a close spelling of the class name (a rename)."""
    module, _, leaf = name.rpartition(".")
    scored = []
    for other in _registry:
        other_module, _, other_leaf = other.rpartition(".")
        if other_leaf == leaf:
            score = 1.0
        else:
            score = difflib.SequenceMatcher(None, leaf.lower(), other_leaf.lower()).ratio()
            score -= 0.0 if other_module == module else 0.1
        if score >= 0.8:
            scored.append((-score, other))
    moved = [other for score, other in scored if score == -1.0]
    return sorted(moved)[:2] if moved else [other for _, other in sorted(scored)[:2]]


def did_you_mean(name: str, *, rows: bool = True) -> str:
    """`` Did you mean 'x'?`` for an unknown job ``name``, with (``rows``) how to keep rows
    queued under the old name working (a ``name`` alias); ``""`` when nothing looks like it."""
    found = similar(name)
    if not found:
        return ""
    shown = " or ".join(repr(n) for n in found)
    if not rows:
        return f" Did you mean {shown}?"
    return (f" Did you mean {shown}? If the class was renamed or moved, rows queued under "
            f"the old name run once the class says `name = {name!r}`.")


def signature_problem(job_class: type[JobLike], args: list[Any],
                      kwargs: dict[str, Any]) -> str:
    """Why ``job_class(*args, **kwargs)`` cannot be called (``"unexpected keyword argument
    'force'"``), from its signature alone; ``""`` when it can (or the signature is unknown).
    Called only after rebuilding a row failed, never on the way of a job that runs."""
    try:
        signature = inspect.signature(job_class)
    except (TypeError, ValueError):
        return ""
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        bare = signature.replace(return_annotation=inspect.Signature.empty, parameters=[
            p.replace(annotation=inspect.Parameter.empty) for p in signature.parameters.values()])
        return f"{exc} (this worker's {job_class.__name__} takes {bare})"
    return ""


def positional_index(job_class: type[JobLike], param: str) -> int | None:
    """Where parameter ``param`` sits among the positional arguments of ``job_class`` (of
    its function, for an ``@job`` function), or ``None`` when it cannot be passed by
    position (or the signature is unknown): argument search finds ``customer_id=9`` in
    ``NotifyCustomer(9, ...)`` with it."""
    target: Any = getattr(job_class, "func", None) or job_class
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return None
    for index, parameter in enumerate(signature.parameters.values()):
        if parameter.kind not in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            return None
        if parameter.name == param:
            return index
    return None


def unregister(name: str) -> None:
    """Forget the job registered as ``name`` (tests that define jobs on the fly)."""
    _registry.pop(name, None)


def all_jobs() -> dict[str, type[JobLike]]:
    return dict(_registry)


# -- display names -------------------------------------------------------------------------
#
# An adapter job runs something else under its own registered name: every django.tasks task
# is queued as ``django_jobguard.task``. Such a class names, in ``display_path``, where its
# payload keeps the dotted name of what it runs (and, in ``result_display_path``, where its
# result row keeps it), so that operators see and search for ``myapp.tasks.reindex``, not the
# adapter. Everything that shows a job's name asks :func:`display_name`.


def _walk(payload: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(payload, dict):
            return None
        payload = payload.get(key)
    return payload


def display_name(name: str, payload: Any, *, result: bool = False) -> str:
    """The name to show for a row of job ``name`` with ``payload``: what an adapter job
    runs (a django.tasks task's dotted path), else ``name`` itself. ``result``: the payload
    is a :class:`~django_jobguard.models.JobResult`'s."""
    job_class = _registry.get(name)
    path = getattr(job_class, "result_display_path" if result else "display_path", None)
    if path:
        shown = _walk(payload, tuple(path))
        if isinstance(shown, str) and shown:
            return shown
    return name


def display_paths(*, result: bool = False) -> dict[str, tuple[str, ...]]:
    """``{registered name: payload path}`` of the adapter jobs (for filters in SQL)."""
    attribute = "result_display_path" if result else "display_path"
    return {name: tuple(getattr(cls, attribute)) for name, cls in _registry.items()
            if getattr(cls, attribute, None)}


def autodiscover() -> None:
    """Import ``<app>.jobs`` for every installed app, then ``JOBGUARD['JOB_MODULES']``."""
    from django_jobguard.conf import jobguard_settings

    autodiscover_modules("jobs")
    for module in jobguard_settings.JOB_MODULES:
        import_string(module) if ":" in module else __import__(module)
