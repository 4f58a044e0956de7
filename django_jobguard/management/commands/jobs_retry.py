"""``manage.py jobs_retry <id…|all>`` or ``jobs_retry --name/--queue/--exception/--tag/--arg``:
queue failed jobs again (``queue:retry``)."""

from django.core.management.base import BaseCommand, CommandError

from django_jobguard import operations


class Command(BaseCommand):
    help = ("Queue failed jobs again with fresh attempts: ids, 'all' (optionally --queue), or "
            "every failed job matching --name / --queue / --exception / --tag / --arg.")

    def add_arguments(self, parser):
        parser.add_argument("ids", nargs="*", help="Failed job ids, or 'all'.")
        parser.add_argument("--queue", help="Only failed jobs of this queue.")
        parser.add_argument("--name", help="Only this job (a django.tasks task's own dotted "
                                           "name too).")
        parser.add_argument("--exception", help="Only failures with this exception: its "
                                                "dotted path or class name (TimeoutError).")
        parser.add_argument("--tag", help="Only failed jobs carrying this tag.")
        parser.add_argument("--arg", action="append", default=[], metavar="LOOKUP=JSON",
                            help="Only jobs whose argument matches, e.g. kwargs__invoice_id=7 "
                                 "or args__0='\"abc\"' (repeat to narrow).")

    def handle(self, *args, **opts):
        ids = opts["ids"]
        if ids != ["all"] and "all" in ids:
            raise CommandError("Give either 'all' or ids, not both.")
        filters = {"name": opts["name"], "exception": opts["exception"], "queue": opts["queue"],
                   "tag": opts["tag"]}
        lookups = []
        for item in opts["arg"]:
            name, sep, value = item.partition("=")
            if not sep:
                raise CommandError(f"--arg {item!r}: write LOOKUP=JSON, e.g. "
                                   f"kwargs__invoice_id=7.")
            lookups.append((name, value))
        if ids and ids != ["all"]:
            if any(filters[k] for k in ("name", "exception", "tag")) or lookups:
                raise CommandError("Give ids or filters (--name, --exception, --tag, --arg), "
                                   "not both.")
            return self.retry_ids(ids, queue=opts["queue"])
        if not ids and not any(filters.values()) and not lookups:
            raise CommandError("Give failed job ids, 'all', or a filter (--name, --queue, "
                               "--exception, --tag, --arg).")
        try:
            for name, _value in lookups:
                if not operations.search.is_argument_param(name):
                    raise operations.SearchError(name, f"--arg {name!r} is not an argument "
                                                       f"lookup: args__<index> or "
                                                       f"kwargs__<name>.")
            search = operations.JobSearch.from_params(
                [*((k, v) for k, v in filters.items() if v), *lookups], failed=True)
        except operations.SearchError as exc:
            raise CommandError(exc.message)
        result = operations.retry_matching(search.failed_jobs(), actor="manage.py jobs_retry",
                                           description=search.describe())
        if result.skipped:
            self.stdout.write(f"{result.skipped} job(s) left in failed jobs: a queued job has "
                              f"their id already.")
        self.stdout.write(self.style.SUCCESS(f"{result.done} job(s) queued again."))

    def retry_ids(self, ids, *, queue):
        try:
            retried = operations.retry(ids, queue=queue or None, actor="manage.py jobs_retry")
        except (ValueError, operations.FailedJobNotFound) as exc:
            raise CommandError(str(exc))
        for job_id in retried:
            self.stdout.write(f"Queued failed job {job_id} again.")
        self.stdout.write(self.style.SUCCESS(f"{len(retried)} job(s) queued again."))
