"""Models the demo jobs work on, and ``JobRun`` where tests record what ran when."""

from django.db import models


class Profile(models.Model):
    name = models.CharField(max_length=100)
    syncs = models.PositiveIntegerField(default=0)


class Invoice(models.Model):
    number = models.CharField(max_length=50, unique=True)
    charged = models.PositiveIntegerField(default=0)
    refunded = models.PositiveIntegerField(default=0)


class JobRun(models.Model):
    """One execution of a job: which, on what key, in which process, from when to when."""

    label = models.CharField(max_length=100)
    key = models.CharField(max_length=100, blank=True, default="")
    job_id = models.CharField(max_length=64, blank=True, default="")
    pid = models.IntegerField(default=0)
    attempt = models.IntegerField(default=0)
    token = models.BigIntegerField(null=True, blank=True)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)


class InvoiceExportLine(models.Model):
    """One invoice written by an export (the bulk invoice export of docs/long-jobs.md)."""

    export = models.CharField(max_length=100)
    invoice = models.ForeignKey(Invoice, on_delete=models.CASCADE)
    charged = models.PositiveIntegerField(default=0)
