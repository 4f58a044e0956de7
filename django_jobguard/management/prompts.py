"""Confirmation of destructive commands, in Django's manner (``manage.py flush``): a prompt
by default, ``--noinput`` (also ``--no-input``, ``--yes``) for scripts.

Unlike ``flush``, a command run without a terminal (cron, CI, a pipe) does not prompt: it
acts as these commands always did, so existing scripts keep working. The prompt guards
people at a terminal.
"""

from __future__ import annotations

import sys
from typing import Any


def add_noinput_argument(parser: Any) -> None:
    parser.add_argument("--noinput", "--no-input", "--yes", action="store_false",
                        dest="interactive",
                        help="Do not ask for confirmation (scripts; also implied when stdin "
                             "is not a terminal).")


def confirmed(question: str, opts: dict[str, Any]) -> bool:
    """True when the command may go on: not interactive, no terminal, or ``yes`` typed."""
    if not opts.get("interactive", True) or not sys.stdin.isatty():
        return True
    answer = input(f"{question}\nType 'yes' to continue, or 'no' to cancel: ")
    return answer.strip().lower() in ("yes", "y")
