"""Tags: short labels set at dispatch (``dispatch(tags=[...])``) or on the job class
(``tags = [...]``), kept on the queued row, on the failed job and on the finished run, and
filtered on everywhere (the admin's lists, the API's ``tag=``).

A row stores its tags as one text column, ``,billing,urgent,`` (empty without tags): a
filter for one tag is then ``LIKE '%,billing,%'`` on every database, with no JSON lookups
that SQLite and MariaDB lack. Tags are validated at dispatch (and when a class is defined),
so every stored value has this shape.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from django.db.models import Q

#: The most tags one job carries.
MAX_TAGS = 10
#: The longest tag, in characters.
MAX_LENGTH = 50
#: Letters, digits and ``_ - . : / @ +``; no commas (the separator) and no spaces.
_ALLOWED = re.compile(r"[\w.:/@+-]+")
#: The width of the column: every tag at its longest, with the separators.
COLUMN_LENGTH = MAX_TAGS * (MAX_LENGTH + 1) + 1


def validate(tags: Any, *, owner: str) -> tuple[str, ...]:
    """``tags`` (a list, tuple or set of strings; ``None`` for none) checked and without
    duplicates, in their order; ``ValueError``/``TypeError`` naming ``owner`` and the problem."""
    if tags is None:
        return ()
    if isinstance(tags, (str, bytes)) or not isinstance(tags, Iterable):
        raise TypeError(f"{owner}: tags must be a list of strings, not {type(tags).__name__} "
                        f"{tags!r}.")
    seen: dict[str, None] = {}
    for tag in tags:
        if not isinstance(tag, str):
            raise TypeError(f"{owner}: tag {tag!r} is a {type(tag).__name__}; tags are strings.")
        if not tag:
            raise ValueError(f"{owner}: a tag is empty.")
        if len(tag) > MAX_LENGTH:
            raise ValueError(f"{owner}: tag {tag[:20]!r}... is {len(tag)} characters long; "
                             f"the most is {MAX_LENGTH}.")
        if not _ALLOWED.fullmatch(tag):
            raise ValueError(f"{owner}: tag {tag!r} has a character other than letters, digits "
                             f"and _ - . : / @ + (no spaces or commas).")
        seen[tag] = None
    if len(seen) > MAX_TAGS:
        raise ValueError(f"{owner}: {len(seen)} tags; a job carries at most {MAX_TAGS}.")
    return tuple(seen)


def encode(tags: Iterable[str]) -> str:
    """The column's text for validated ``tags``: ``,a,b,``, or ``""`` for none."""
    tags = list(tags)
    return f",{','.join(tags)}," if tags else ""


def decode(text: str | None) -> list[str]:
    """The tags a column's text holds."""
    return [tag for tag in (text or "").split(",") if tag]


def merged(*groups: Iterable[str] | None, owner: str) -> tuple[str, ...]:
    """The tags of several sources (the class's, then the dispatch's), validated together."""
    return validate([tag for group in groups for tag in validate(group, owner=owner)],
                    owner=owner)


def lookup(tag: str, field: str = "tags") -> Q:
    """Rows carrying ``tag`` (a whole tag: ``bill`` does not find ``billing``). A value that
    could not be a tag finds nothing."""
    tag = tag.strip()
    if not tag or not _ALLOWED.fullmatch(tag) or len(tag) > MAX_LENGTH:
        return Q(pk__in=[])
    return Q(**{f"{field}__contains": f",{tag},"})
