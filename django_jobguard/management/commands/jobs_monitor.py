"""``manage.py jobs_monitor default:100,high:10``: queue depths, paused queues, the oldest
waiting job's age (latency), the recommended worker count and breached objectives
(:mod:`django_jobguard.slo`); exit 1 over a threshold or when jobs wait on a queue that no live
worker serves."""

import json
import sys

from django.core.management.base import CommandError

from django_jobguard import operations, slo
from django_jobguard.management import ReadOnlyCommand


class Command(ReadOnlyCommand):
    help = ("Show waiting/delayed/reserved/failed counts per queue. With queue:max pairs, "
            "exit 1 when a queue's size (waiting + delayed + reserved) reaches its max. "
            "Also exit 1 when jobs wait on a queue that no live worker serves "
            "(unless --allow-unserved). Paused queues are listed and marked PAUSED; each queue "
            "shows its latency (oldest waiting job), the recommended worker count and any "
            "breached objective (JOBGUARD['QUEUES'][q]['max_wait'] / 'max_failure_rate').")

    def add_arguments(self, parser):
        parser.add_argument("queues", nargs="?", default="",
                            help="queue:max pairs, comma separated (a bare name uses --max).")
        parser.add_argument("--max", type=int, default=1000)
        parser.add_argument("--json", action="store_true")
        parser.add_argument("--allow-unserved", action="store_true",
                            help="Report queues no live worker serves without exiting 1.")

    def handle(self, *args, **opts):
        thresholds = {}
        for part in filter(None, (p.strip() for p in opts["queues"].split(","))):
            name, _, limit = part.partition(":")
            try:
                thresholds[name] = int(limit) if limit else opts["max"]
            except ValueError:
                raise CommandError(f"{part!r}: the threshold after ':' must be a number.")
        health = operations.monitor(thresholds, default_max=opts["max"])
        loads = slo.measure()
        report = []
        for queue in health.queues:
            load = loads.get(queue.queue)
            report.append({**queue.as_dict(),
                           "latency_seconds": round(load.latency, 3) if load else 0.0,
                           "recommended_workers": load.recommended_workers if load else 0,
                           "breached": list(load.breached) if load else []})
        if opts["json"]:
            self.stdout.write(json.dumps(report, indent=2))
        else:
            for r in report:
                style = self.style.ERROR if r["status"] == "ALERT" else self.style.SUCCESS
                self.stdout.write(f"{r['queue']:<20} size {r['size']:>7} (waiting {r['waiting']},"
                                  f" delayed {r['delayed']}, reserved {r['reserved']}, failed "
                                  f"{r['failed']})  max {r['max']}  latency "
                                  f"{r['latency_seconds']:g} s  workers needed "
                                  f"{r['recommended_workers']}  " + style(r["status"])
                                  + (self.style.WARNING("  PAUSED") if r["paused"] else "")
                                  + (self.style.ERROR("  UNSERVED: no live worker serves it")
                                     if r["unserved"] else "")
                                  + "".join(self.style.ERROR(f"  BREACHED {name}")
                                            for name in r["breached"]))
        if health.alerts:
            self.stderr.write(f"Over threshold: {', '.join(health.alerts)}")
        if health.unserved:
            self.stderr.write(f"Jobs wait with no live worker serving them: "
                              f"{', '.join(health.unserved)}")
        if health.alerts or (health.unserved and not opts["allow_unserved"]):
            sys.exit(1)
