"""``manage.py jobs_locks [--release KEY] [--clean] [--store ALIAS]``: list and free locks.

A store that cannot be reached is a ``CommandError`` naming it and the error (exit status 1,
one line on stderr), not a traceback. Locks ``--release`` freed before the outage stay freed
(each is printed as it is)."""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from django_jobguard import operations
from django_jobguard.exceptions import StoreUnavailableError
from django_jobguard.management.prompts import add_noinput_argument, confirmed
from django_jobguard.operations import LockRow
from django_jobguard.stores import Store, get_store

ACTOR = "manage.py jobs_locks"


def _as_dict(row: LockRow) -> dict:
    info = row.info
    return {"key": info.key, "kind": info.kind, "owner": info.owner, "token": info.token,
            "job_id": info.job_id, "store": info.store,
            "acquired_at": info.acquired_at.isoformat() if info.acquired_at else None,
            "expires_at": info.expires_at.isoformat() if info.expires_at else None,
            "expires_in": row.expires_in, "stale": row.stale, "reason": row.stale_reason}


def _expires(status: LockRow) -> str:
    if status.expires_in is None:
        return "never"
    if status.expires_in <= 0:
        return "expired"
    return f"in {status.expires_in:.0f}s" if status.expires_in >= 10 else \
        f"in {status.expires_in:.1f}s"


class Command(BaseCommand):
    help = ("List unique and overlap locks (key, kind, owner, fencing token, acquired, expiry, "
            "stale flag); --release KEY force-releases one, --clean removes expired ones.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--store", default=None,
                            help="Store alias (default: JOBGUARD['STORE']).")
        parser.add_argument("--prefix", default="jobguard:",
                            help="Only keys starting with this (default: jobguard:).")
        parser.add_argument("--release", metavar="KEY", action="append", default=[],
                            help="Free this lock whoever holds it (repeatable).")
        parser.add_argument("--clean", action="store_true", help="Remove expired locks.")
        add_noinput_argument(parser)
        parser.add_argument("--stale", action="store_true", help="List only stale locks.")
        parser.add_argument("--json", action="store_true", help="Print the list as JSON.")
        parser.add_argument("--database", default=None,
                            help="Database alias holding the queue"
                                 " (for the stale check; default: JOBGUARD['DATABASE']).")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            store = get_store(opts["store"])
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc))
        try:
            self._run(store, opts)
        except StoreUnavailableError as outage:  # a message, not a traceback
            raise CommandError(f"Store {outage.store!r} cannot be reached: "
                               f"{outage.error_line}") from outage

    def _run(self, store: Store, opts: dict[str, Any]) -> None:
        if opts["release"] or opts["clean"]:
            missing = []
            for key in opts["release"]:
                row = operations.inspect_lock(store, key, using=opts["database"])
                if row is not None and not row.stale and row.info.job_id and not confirmed(
                        f"Lock {key} is held by job {row.info.job_id}, which is still queued "
                        f"or running on a live worker; releasing it lets a second copy in.",
                        opts):
                    raise CommandError(f"Cancelled; {key} was not released.")
                if operations.force_release(store, key, actor=ACTOR):
                    self.stdout.write(self.style.SUCCESS(f"Released {key}."))
                else:
                    missing.append(key)
            if opts["clean"]:
                count = operations.clean_locks(store, actor=ACTOR)
                self.stdout.write(self.style.SUCCESS(f"Removed {count} expired lock(s)."))
            if missing:
                raise CommandError(f"Not held: {', '.join(missing)}.")
            return
        statuses = [row for row in operations.inspect_locks(store, using=opts["database"])
                    if row.key.startswith(opts["prefix"])]
        statuses.sort(key=lambda row: row.key)
        if opts["stale"]:
            statuses = [s for s in statuses if s.stale]
        if opts["json"]:
            self.stdout.write(json.dumps([_as_dict(s) for s in statuses], indent=2))
            return
        if not statuses:
            self.stdout.write(f"No locks in store {store.alias!r}.")
            return
        rows = [[s.info.key, s.info.kind, s.info.owner, str(s.info.token),
                 s.info.acquired_at.strftime("%Y-%m-%d %H:%M:%S") if s.info.acquired_at else "",
                 _expires(s), f"STALE: {s.stale_reason}" if s.stale else ""] for s in statuses]
        header = ["KEY", "KIND", "OWNER", "TOKEN", "ACQUIRED (UTC)", "EXPIRES", ""]
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
        for index, cells in enumerate([header, *rows]):
            line = "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=False))
            line = f"{line}  {cells[-1]}".rstrip()
            stale = index and statuses[index - 1].stale
            self.stdout.write(self.style.WARNING(line) if stale else line)
        stale_count = sum(s.stale for s in statuses)
        self.stdout.write(f"{len(statuses)} lock(s) in store {store.alias!r}, {stale_count} "
                          f"stale." + (" Free one with --release KEY." if stale_count else ""))
