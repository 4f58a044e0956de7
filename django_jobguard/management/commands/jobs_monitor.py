"""``manage.py jobs_monitor default:100,high:10``: queue depths; exit 1 over a threshold."""

import json
import sys

from django.core.management.base import BaseCommand, CommandError

from django_jobguard import queue


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
        counts = queue.stats()
        names = list(thresholds) or sorted(counts)
        report, alert = [], False
        for name in names:
            c = counts.get(name, {"waiting": 0, "delayed": 0, "reserved": 0, "failed": 0})
            size = c["waiting"] + c["delayed"] + c["reserved"]
            limit = thresholds.get(name, opts["max"])
            status = "ALERT" if size >= limit else "OK"
            alert = alert or status == "ALERT"
            report.append({"queue": name, "size": size, **c, "max": limit, "status": status})
        if opts["json"]:
            self.stdout.write(json.dumps(report, indent=2))
        else:
            for r in report:
                style = self.style.ERROR if r["status"] == "ALERT" else self.style.SUCCESS
                self.stdout.write(f"{r['queue']:<20} size {r['size']:>7} (waiting {r['waiting']},"
                                  f" delayed {r['delayed']}, reserved {r['reserved']}, failed "
                                  f"{r['failed']})  max {r['max']}  " + style(r["status"]))
        if alert:
            over = ", ".join(r["queue"] for r in report if r["status"] == "ALERT")
            self.stderr.write(f"Over threshold: {over}")
            sys.exit(1)
