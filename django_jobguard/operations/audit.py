"""The audit log: one WARNING line per destructive operator action that changed something."""

from __future__ import annotations

import logging

logger = logging.getLogger("django_jobguard.operations")
# Route this logger to keep an audit trail (docs/operations.md). Without a handler of the
# project's, Python's last-resort handler would print each record on stderr in the middle of
# the command's (or the demo's) own output, as if someone had stepped in.
logger.addHandler(logging.NullHandler())


def record(operation: str, count: int, what: str, actor: str) -> None:
    """Log ``what`` (a sentence without its end) ``by actor``; the record also carries
    ``operation``, ``count`` and ``actor`` for structured handlers."""
    actor = actor or "an operator"
    logger.warning("%s by %s.", what, actor,
                   extra={"operation": operation, "count": count, "actor": actor})
