"""Chains: ``chain(A(1), B(2), C()).dispatch()`` runs the jobs in order, each after the
previous one succeeded (Laravel's ``Bus::chain``, celery's ``chain``).

Every link is validated and encoded at dispatch and kept in a
:class:`~django_jobguard.models.Chain` row. The pipeline calls :func:`advance` in the
transaction that acks a link (or moves it to failed jobs), so a worker killed between two
links loses none: either the ack and the next link's row are both committed, or neither is and
the link runs again when its lease runs out. A failed link stops the chain: the links after
it are recorded ``cancelled``; retrying the failed job (``jobs_retry``, the admin, the API)
resumes the chain from there.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.db.models.functions import Now

from django_jobguard import queue as job_queue
from django_jobguard.conf import queue_database
from django_jobguard.models import Chain

if TYPE_CHECKING:
    from django_jobguard.jobs import Job

__all__ = ["ChainDispatched", "JobChain", "advance", "chain", "retried"]

logger = logging.getLogger("django_jobguard.chains")

#: The payload key that marks a job as a chain link: ``{"id": chain id, "index": n}``.
MARKER = "chain"
PENDING, QUEUED, DONE, FAILED, CANCELLED = "pending", "queued", "done", "failed", "cancelled"


@dataclass(frozen=True)
class ChainDispatched:
    """What ``chain(...).dispatch()`` returns: the chain's id and every link's job id."""

    id: str
    job_ids: list[str]


class JobChain:
    """Jobs to run in order; build it with :func:`chain`."""

    def __init__(self, jobs: list[Job], *, name: str = "") -> None:
        if not jobs:
            raise ValueError("A chain needs at least one job.")
        from django_jobguard.jobs import Job

        for job in jobs:
            if not isinstance(job, Job):
                raise TypeError(f"A chain holds jobs (Job instances), not {job!r}.")
        self.jobs = jobs
        self.name = name

    def dispatch(self, *, using: str | None = None) -> ChainDispatched:
        """Record the chain and queue its first link, in the caller's transaction."""
        using = queue_database(using)
        from django_jobguard.jobs import build_row

        chain_id = uuid.uuid4()
        links: list[dict[str, Any]] = []
        first: job_queue.NewJob | None = None
        for index, job in enumerate(self.jobs):
            row, envelope = build_row(job)
            # Links are queued by the chain, not by dispatch(): no unique lock is taken.
            envelope = envelope.replace(unique=None, extra={
                **envelope.extra, MARKER: {"id": str(chain_id), "index": index}})
            row.payload = envelope.encode()
            if index == 0:
                first = row
            links.append({"job": row.name, "queue": row.queue, "priority": row.priority,
                          "id": str(row.id), "payload": envelope.as_json(),
                          "status": QUEUED if index == 0 else PENDING,
                          **({"fair_key": row.fair_key} if row.fair_key else {})})
        with transaction.atomic(using=using):
            Chain.objects.using(using).create(id=chain_id, name=self.name, links=links)
            assert first is not None  # a chain has at least one job
            job_queue.push([first], using=using)
        return ChainDispatched(id=str(chain_id), job_ids=[link["id"] for link in links])


def chain(*jobs: Job, name: str = "") -> JobChain:
    """``chain(A(1), B(2), C()).dispatch()``: run the jobs in order, each after the previous
    one succeeded."""
    return JobChain(list(jobs), name=name)


def marker_of(payload: Any) -> tuple[str, int] | None:
    """``(chain id, link index)`` of a chain link's payload, or ``None``."""
    if not isinstance(payload, Mapping):
        return None
    marker = payload.get(MARKER)
    if (isinstance(marker, Mapping) and isinstance(marker.get("id"), str)
            and isinstance(marker.get("index"), int)):
        return marker["id"], marker["index"]
    return None


def _locked(chain_id: str, index: int, using: str) -> Chain | None:
    """The chain row, locked, if ``index`` is one of its links; ``None`` when it was deleted
    or its ``links`` is not a list of objects (bad stored data: the link then finishes as a
    job of its own instead of failing its ack)."""
    row = Chain.objects.using(using).select_for_update().filter(id=chain_id).first()
    if row is None:
        return None
    links = row.links
    if not (isinstance(links, list) and all(isinstance(link, dict) for link in links)):
        logger.warning("Chain %s has unreadable links (not a list of objects); its link %d "
                       "finished on its own.", chain_id, index)
        return None
    return row if 0 <= index < len(links) else None


def advance(payload: Any, *, succeeded: bool, using: str | None = None) -> None:
    """A link finished (call inside the transaction that acks or fails it): queue the next
    link, complete the chain, or stop it and cancel the rest."""
    using = queue_database(using)
    marker = marker_of(payload)
    if marker is None:
        return
    chain_id, index = marker
    row = _locked(chain_id, index, using)
    if row is None:
        return  # the chain was deleted by an operator: the link ran on its own
    links = row.links
    fields = ["links", "status", "finished_at"]
    if not succeeded:
        links[index]["status"] = FAILED
        for link in links[index + 1:]:
            link["status"] = CANCELLED
        row.status, row.finished_at = FAILED, Now()
    else:
        links[index]["status"] = DONE
        following = links[index + 1] if index + 1 < len(links) else None
        if following is None:
            row.status, row.finished_at = "completed", Now()
        elif following["status"] in (PENDING, CANCELLED):
            following["status"] = QUEUED
            for link in links[index + 2:]:
                link["status"] = PENDING
            job_queue.push([job_queue.NewJob(
                id=uuid.UUID(following["id"]), name=following["job"],
                queue=following["queue"], priority=following["priority"],
                fair_key=following.get("fair_key", ""),
                payload=json.dumps(following["payload"], separators=(",", ":")))],
                using=using)
            row.status, row.finished_at = "running", None
    row.save(using=using, update_fields=fields)


def retried(payloads: list[Any], *, using: str | None = None) -> None:
    """Failed links were queued again (call inside the retry's transaction): their chains
    run again from there, the cancelled links after them pending."""
    using = queue_database(using)
    for payload in payloads:
        marker = marker_of(payload)
        if marker is None:
            continue
        row = _locked(marker[0], marker[1], using)
        if row is None:
            continue
        row.links[marker[1]]["status"] = QUEUED
        for link in row.links[marker[1] + 1:]:
            link["status"] = PENDING
        row.status, row.finished_at = "running", None
        row.save(using=using, update_fields=["links", "status", "finished_at"])
