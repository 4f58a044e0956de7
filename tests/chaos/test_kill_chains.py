"""kill -9 a worker in the middle of a chain: no link is lost, none runs out of order."""

from __future__ import annotations

import pytest
from demo.models import JobRun

from django_jobguard import chain
from django_jobguard.models import Chain, QueuedJob
from tests.support import wait_for, worker_env
from tests.support.flow_jobs import Step
from tests.support.inprocess import make_due

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("killed_in", [0, 1, 2])
def test_kill_9_between_links_loses_no_link(workers, killed_in):
    labels = ["k0", "k1", "k2"]
    handle = chain(*(Step(label, first_run_seconds=60 if i == killed_in else 0)
                     for i, label in enumerate(labels))).dispatch()
    env = worker_env(JOBGUARD_EXTRA_JOB_MODULES="tests.support.flow_jobs")
    first = workers(1, "--sleep", "0.1", "--tries", "3", env=env)
    # the earlier links were acked (and the next one queued) before this one started
    wait_for(lambda: JobRun.objects.filter(label=labels[killed_in]).exists(), timeout=60)
    killed_pid = first.procs[0].pid
    first.kill()  # SIGKILL
    assert QueuedJob.objects.count() == 1  # the running link, still reserved by the dead
    make_due()  # its lease running out, without waiting RETRY_AFTER
    workers(1, "--sleep", "0.1", "--tries", "3", "--stop-when-empty", env=env).wait(60)

    runs = list(JobRun.objects.order_by("started_at").values_list("label", "pid", "ended_at"))
    assert [label for label, _, _ in runs] == (
        labels[:killed_in + 1] + [labels[killed_in]] + labels[killed_in + 1:])
    cut = runs[killed_in]
    assert cut[1] == killed_pid and cut[2] is None  # only the killed run was cut short
    assert all(ended is not None for _, _, ended in runs[killed_in + 1:])
    row = Chain.objects.get(id=handle.id)
    assert row.status == "completed" and [link["status"] for link in row.links] == ["done"] * 3
    assert not QueuedJob.objects.exists()
