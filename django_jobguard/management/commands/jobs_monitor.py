"""``manage.py jobs_monitor default:100,high:10``: queue depths; exit 1 over a threshold."""

import json
import sys

from django.core.management.base import BaseCommand, CommandError

from django_jobguard import operations


class Command(BaseCommand):
    help = ("Show waiting/delayed/reserved/failed counts per queue. With queue:max pairs, "
            "exit 1 when a queue's size (waiting + delayed + reserved) reaches its max.")

    def add_arguments(self, parser):
        parser.add_argument("queues", nargs="?", default="",
                            help="queue:max pairs, comma separated (a bare name uses --max).")
        parser.add_argument("--max", type=int, default=1000)
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **opts):
        thresholds = {}
        for part in filter(None, (p.strip() for p in opts["queues"].split(","))):
            name, _, limit = part.partition(":")
            try:
                thresholds[name] = int(limit) if limit else opts["max"]
            except ValueError:
                raise CommandError(f"{part!r}: the threshold after ':' must be a number.")
        health = operations.monitor(thresholds, default_max=opts["max"])
        report = [queue.as_dict() for queue in health.queues]
        if opts["json"]:
            self.stdout.write(json.dumps(report, indent=2))
        else:
            for r in report:
                style = self.style.ERROR if r["status"] == "ALERT" else self.style.SUCCESS
                self.stdout.write(f"{r['queue']:<20} size {r['size']:>7} (waiting {r['waiting']},"
                                  f" delayed {r['delayed']}, reserved {r['reserved']}, failed "
                                  f"{r['failed']})  max {r['max']}  " + style(r["status"]))
        if health.alerts:
            self.stderr.write(f"Over threshold: {', '.join(health.alerts)}")
            sys.exit(1)
