"""``manage.py jobs_schedule``: periodic schedules with their last and next run
(Laravel's ``schedule:list``); ``--enqueue`` queues due ticks once (``schedule:run``)."""

import json

from django.core.management.base import BaseCommand

from django_jobguard import schedules


class Command(BaseCommand):
    help = ("List periodic schedules (JOBGUARD['SCHEDULE'] and @periodic) with their last and "
            "next run. Workers enqueue due ticks themselves; --enqueue does it once here.")

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true")
        parser.add_argument("--enqueue", action="store_true",
                            help="Queue the ticks due now (each tick once, as workers do).")

    def handle(self, *args, **opts):
        if opts["enqueue"]:
            count = schedules.enqueue_due()
            self.stderr.write(f"Recorded {count} tick(s).")
        rows = [status.as_dict() for status in schedules.schedule_status()]
        if opts["json"]:
            self.stdout.write(json.dumps(rows, indent=2))
            return
        if not rows:
            self.stdout.write("No schedules. Declare them in JOBGUARD['SCHEDULE'] or with "
                              "@periodic.")
            return
        for r in rows:
            last = r["last_tick"] or "never"
            if r["last_skipped"]:
                last += f" (skipped: {r['last_skipped']})"
            state = "" if r["enabled"] else "  [disabled]"
            self.stdout.write(f"{r['name']:<24} {r['cron']:<16} {r['timezone']:<16} "
                              f"{r['job']}  last {last}  next {r['next_tick'] or 'never'}"
                              f"{state}")
