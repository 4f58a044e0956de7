"""What a job's source says about its middleware: the scanner that reads literal
``RateLimited("name")`` and ``WithoutOverlapping(...)`` calls in a job's ``middleware()`` (or a
``@job`` middleware factory), and the checks built on it: E007 (an undefined limiter, run by
``check_settings``) and W002 (``WithoutOverlapping`` without ``expire_after``)."""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from dataclasses import dataclass
from typing import Any

from django.core.checks import Error, Tags, Warning, register


def limiter_errors() -> list:
    """jobguard.E007: a registered job uses ``RateLimited("name")`` for an undefined limiter."""
    from django_jobguard import registry
    from django_jobguard.limits import rate_limiter

    errors = []
    for job_name, job_class in sorted(registry.all_jobs().items()):
        for name in sorted(referenced_limiters(job_class) - set(rate_limiter.names())):
            errors.append(Error(
                f"Job {job_name!r} uses RateLimited({name!r}), but no limiter {name!r} is "
                f"defined.",
                hint=f"Define it with @rate_limiter({name!r}) in <app>/jobs.py or a module in "
                     f"JOBGUARD['JOB_MODULES'], or fix the name.",
                id="jobguard.E007",
            ))
    return errors


@register(Tags.compatibility)
def check_overlap_expiry(app_configs: Any = None, **kwargs: Any) -> list:
    from django_jobguard import registry

    return [
        Warning(
            f"{name} uses WithoutOverlapping without expire_after: if a worker is killed while "
            f"running it (timeout, OOM, deploy), the lock stays until someone force-releases "
            f"it and every later {name} job on that key is deferred forever.",
            hint="Pass expire_after a little above the job's timeout, or expire_after with "
                 "renew=True; a stuck lock is released with manage.py jobs_locks --release KEY.",
            obj=job_class,
            id="jobguard.W002",
        )
        for name, job_class in sorted(registry.all_jobs().items())
        if has_unbounded_overlap(job_class)
    ]


# -- reading middleware from source (E007, W002) ----------------------------------------------
# Only calls written literally in a job's ``middleware()`` (or a ``@job`` middleware factory)
# are seen; anything built at run time is given the benefit of the doubt.


@dataclass(frozen=True)
class LiteralCall:
    """A call ``Callee(...)`` found in source: its first argument when that is a string
    literal, and its keyword arguments (``None`` when they cannot be known: ``**options``,
    or source that does not parse on its own, such as a lambda inside a decorator line)."""

    first: str | None
    keywords: dict[str | None, ast.expr] | None


_calls_cache: dict[tuple[Any, str], list[LiteralCall]] = {}


def literal_calls(function: Any, callee: str) -> list[LiteralCall]:
    """Calls of ``callee`` (a name or an attribute) in ``function``'s source."""
    cache_key = (function, callee)
    if cache_key not in _calls_cache:
        _calls_cache[cache_key] = _scan(function, callee)
    return _calls_cache[cache_key]


def _scan(function: Any, callee: str) -> list[LiteralCall]:
    try:
        source = textwrap.dedent(inspect.getsource(function))
    except (OSError, TypeError):
        return []
    try:
        tree = ast.parse(source)
    except SyntaxError:  # e.g. a lambda inside a decorator line: its first string only
        pattern = re.compile(rf"""\b{re.escape(callee)}\(\s*(["'])([^"']+)\1""")
        return [LiteralCall(first=m.group(2), keywords=None) for m in pattern.finditer(source)]
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
        if name != callee:
            continue
        first = node.args[0] if node.args else None
        keywords = {kw.arg: kw.value for kw in node.keywords}
        found.append(LiteralCall(
            first=first.value if isinstance(first, ast.Constant)
            and isinstance(first.value, str) else None,
            keywords=None if None in keywords else keywords))
    return found


def _middleware_sources(job_class: type) -> list[Any]:
    """The functions whose source may build a job's middleware."""
    from django_jobguard.decorators import FunctionJob
    from django_jobguard.jobs import Job

    method = getattr(job_class, "middleware", None)
    function = getattr(method, "__func__", method)
    own = [] if function in (Job.middleware, FunctionJob.middleware, None) else [function]
    return own + list(getattr(job_class, "middleware_factories", None) or ())


def referenced_limiters(job_class: type) -> set[str]:
    """Limiter names a job passes to ``RateLimited("…")`` as string literals."""
    return {call.first for source in _middleware_sources(job_class)
            for call in literal_calls(source, "RateLimited") if call.first}


def has_unbounded_overlap(job_class: type) -> bool:
    """True when ``job_class`` (as far as can be told without running it) uses
    ``WithoutOverlapping`` with no ``expire_after`` (or a literal 0)."""
    from django_jobguard.decorators import OverlapFactory

    for source in _middleware_sources(job_class):
        if isinstance(source, OverlapFactory):
            if not source.expire_after:
                return True
            continue
        for call in literal_calls(source, "WithoutOverlapping"):
            if call.keywords is None:
                continue
            value = call.keywords.get("expire_after")
            if value is None or (isinstance(value, ast.Constant) and not value.value):
                return True
    return False
