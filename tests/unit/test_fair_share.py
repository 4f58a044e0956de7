"""Fair share (django_jobguard/fair_share.py): a job's ``fair_key`` on its row, the fair claim's
order on the database under test (weighted round robin over the keys, from each process's
cursor), its starvation bound, ``per_key_concurrency``, and queues that are not fair.

The cap across worker processes: tests/integration/test_fair_share_workers.py."""

from __future__ import annotations

import random

import pytest
from django.test import override_settings

from django_jobguard import Job, dispatch, dispatch_many, fair_share, job, queue
from django_jobguard.dialects import dialect_for
from django_jobguard.fair_share import Cursor, advance
from django_jobguard.models import QueuedJob
from tests.support import jobs

pytestmark = pytest.mark.django_db

FAIR = {"QUEUES": {"fair": {"fair": True}}}


class TenantReport(Job):
    def __init__(self, tenant: str, n: int = 0):
        self.tenant, self.n = tenant, n

    def fair_key(self) -> str:
        return f"tenant-{self.tenant}"

    def handle(self):
        return self.n


class Shared(Job):
    fair_key = "shared"

    def handle(self):
        return None


@job(fair_key=lambda account, n=0: f"account-{account}")
def account_job(account, n=0):
    return n


@pytest.fixture(autouse=True)
def _fresh_cursors(monkeypatch):
    """Cursors start at the first key here (workers start at a random one), so that the
    orders below are exact."""
    monkeypatch.setattr(fair_share, "RANDOM_START", False)
    fair_share.reset()
    yield
    fair_share.reset()


@override_settings(JOBGUARD=FAIR)
def test_a_process_starts_its_rotation_at_a_random_key(monkeypatch):
    monkeypatch.setattr(fair_share, "RANDOM_START", True)
    backlog({f"k{i:02}": 1 for i in range(30)})
    firsts = set()
    for _ in range(8):
        fair_share.reset()
        firsts.add(fair_share._start("default", "fair").key)
    assert len(firsts) > 1 and firsts <= {f"k{i:02}" for i in range(30)} | {""}
    assert fair_share._start("default", "elsewhere") == Cursor()  # no row of that queue


def backlog(counts: dict[str, int], *, name: str = "fair", **options) -> None:
    """``counts[key]`` jobs per key, dispatched key by key (the first key's all first)."""
    for key, count in counts.items():
        dispatch_many([jobs.Noop(n) for n in range(count)], queue=name, fair_key=key,
                      **options)


def served(limit: int = 1, *, claims: int = 100, worker: str = "w", name: str = "fair"):
    """The keys of the rows claimed (and acked) ``limit`` at a time, in claim order."""
    keys = []
    for _ in range(claims):
        rows = queue.claim([name], worker_id=worker, limit=limit)
        if not rows:
            break
        keys += [row.fair_key for row in rows]
        for row in rows:
            assert queue.ack(row)
    return keys


def test_the_fair_key_is_stored_from_the_class_a_method_the_decorator_or_the_dispatch():
    dispatch(TenantReport("acme"))
    dispatch(Shared())
    account_job.dispatch(7)
    dispatch(TenantReport("acme"), fair_key="override")
    dispatch(jobs.Noop())
    assert sorted(QueuedJob.objects.values_list("fair_key", flat=True)) == [
        "", "account-7", "override", "shared", "tenant-acme"]


def test_a_fair_key_longer_than_the_column_is_refused():
    with pytest.raises(ValueError, match="fair_key"):
        dispatch(jobs.Noop(), fair_key="k" * 256)


@override_settings(JOBGUARD=FAIR)
@pytest.mark.parametrize("limit", [1, 3, 4, 50])
def test_keys_take_turns_whatever_the_claim_size(limit):
    backlog({"a": 5, "b": 3, "c": 1})
    assert served(limit) == list("abcababaa")


@override_settings(JOBGUARD={"QUEUES": {"fair": {"fair_weights": {"a": 2}}}})
@pytest.mark.parametrize("limit", [1, 2, 3, 50])
def test_a_weight_gives_a_key_that_many_rows_per_turn(limit):
    backlog({"a": 5, "b": 3, "c": 1})
    assert served(limit) == list("aabcaabab")


@override_settings(JOBGUARD=FAIR)
def test_within_a_key_rows_come_by_priority_then_age():
    for n in range(3):  # one at a time: one statement's rows have one time on MariaDB
        dispatch(jobs.Noop(n), queue="fair", fair_key="a")
    dispatch(jobs.Noop(99), queue="fair", fair_key="a", priority=5)
    dispatch(jobs.Noop(50), queue="fair", fair_key="b")
    rows = queue.claim(["fair"], worker_id="w", limit=10)
    assert [(r.fair_key, r.payload["args"][0]) for r in rows] == [
        ("a", 99), ("b", 50), ("a", 0), ("a", 1), ("a", 2)]


@override_settings(JOBGUARD=FAIR)
def test_a_new_key_joins_the_rotation_at_once():
    backlog({"a": 6})
    assert served(1, claims=2) == ["a", "a"]
    backlog({"b": 1})
    assert served(1, claims=2) == ["b", "a"]


@override_settings(JOBGUARD=FAIR)
def test_a_paused_fair_queue_gives_nothing():
    from django_jobguard import operations

    backlog({"a": 2, "b": 2})
    operations.pause("fair")
    assert queue.claim(["fair"], worker_id="w", limit=5) == []
    operations.resume("fair")
    assert len(queue.claim(["fair"], worker_id="w", limit=5)) == 4


@override_settings(JOBGUARD=FAIR)
def test_rows_another_claim_holds_are_skipped_and_the_count_is_kept():
    backlog({"a": 3, "b": 3})
    first = queue.claim(["fair"], worker_id="w1", limit=2)
    second = queue.claim(["fair"], worker_id="w2", limit=2)
    assert not {r.id for r in first} & {r.id for r in second}
    assert len(second) == 2 and QueuedJob.objects.filter(reserved_at__isnull=False).count() == 4


def test_a_queue_that_is_not_fair_keeps_the_plain_order():
    backlog({"a": 3, "b": 2}, name="plain")
    assert served(1, name="plain") == list("aaabb")


@override_settings(JOBGUARD={"QUEUES": {"fair": {"per_key_concurrency": 2}}})
def test_per_key_concurrency_caps_the_reserved_rows_of_each_key():
    backlog({"a": 5, "b": 1, "c": 3})
    rows = queue.claim(["fair"], worker_id="w1", limit=10)
    assert sorted(r.fair_key for r in rows) == ["a", "a", "b", "c", "c"]
    assert queue.claim(["fair"], worker_id="w2", limit=10) == []
    assert queue.ack(next(r for r in rows if r.fair_key == "a"))
    (again,) = queue.claim(["fair"], worker_id="w2", limit=10)
    assert again.fair_key == "a"
    assert queue.release(again)  # back to the queue: no longer counted
    assert [r.fair_key for r in queue.claim(["fair"], worker_id="w3", limit=10)] == ["a"]


@override_settings(JOBGUARD={"QUEUES": {"fair": {"per_key_concurrency": 1}}})
def test_keys_at_their_cap_do_not_hold_up_the_others():
    backlog({f"k{i:02}": 2 for i in range(8)})
    first = queue.claim(["fair"], worker_id="w1", limit=3)
    second = queue.claim(["fair"], worker_id="w2", limit=3)
    third = queue.claim(["fair"], worker_id="w3", limit=3)
    keys = [r.fair_key for r in first + second + third]
    assert sorted(keys) == [f"k{i:02}" for i in range(8)]  # every key once, none twice


@override_settings(JOBGUARD={"QUEUES": {"fair": {"fair": True, "global_concurrency": 3}}})
def test_a_global_cap_holds_on_a_fair_queue():
    backlog({"a": 3, "b": 3})
    assert len(queue.claim(["fair"], worker_id="w1", limit=10)) == 3
    assert queue.claim(["fair"], worker_id="w2", limit=10) == []


@override_settings(JOBGUARD={"QUEUES": {"fair": {"fair_weights": {"k1": 3, "k4": 2}}}})
@pytest.mark.parametrize("seed", [1, 2])
def test_the_starvation_bound_holds(seed):
    """Every key with a due row is served within the next W - w + 1 rows the worker claims
    (W: the weights of the keys with due rows, w: the key's own), for any claim sizes."""
    rng = random.Random(seed)
    weights = {"k1": 3, "k4": 2}
    backlog({f"k{i}": rng.randint(1, 12) for i in rng.sample(range(8), 8)})
    total = 8 + 2 + 1  # W: every key has due rows from the start, none joins
    waiting: dict[str, int] = {}  # rows claimed since the key was last served
    while True:
        due = set(QueuedJob.objects.filter(queue="fair").values_list("fair_key", flat=True))
        rows = queue.claim(["fair"], worker_id="w", limit=rng.choice([1, 2, 3, 5, 8]))
        if not rows:
            break
        for row in rows:
            for key in due:
                waiting[key] = 0 if key == row.fair_key else waiting.get(key, 0) + 1
                assert waiting[key] <= total - weights.get(key, 1), (key, waiting)
            assert queue.ack(row)
    assert not QueuedJob.objects.exists()


def test_the_cursor_moves_to_the_last_key_with_the_rows_of_its_turn_used():
    weights = {"a": 3}
    assert advance(Cursor(), weights, ["a", "b"]) == Cursor("b", 0)
    assert advance(Cursor(), weights, ["b", "a"]) == Cursor("a", 1)
    assert advance(Cursor("a", 1), weights, ["a"]) == Cursor("a", 2)
    assert advance(Cursor("a", 2), weights, ["a"]) == Cursor("a", 0)
    assert advance(Cursor("a", 2), weights, ["a", "b", "a", "a"]) == Cursor("a", 2)


@override_settings(JOBGUARD=FAIR)
def test_each_process_cursor_is_per_database_and_queue():
    backlog({"a": 2, "b": 2})
    queue.claim(["fair"], worker_id="w", limit=1)
    assert fair_share._cursors == {(dialect_for("default").using, "fair"): Cursor("a", 0)}


def test_a_failed_job_retried_keeps_its_fair_key():
    from django_jobguard import operations

    dispatch(jobs.Noop(), fair_key="tenant-9")
    (row,) = queue.claim(["default"], worker_id="w")
    queue.fail(row, RuntimeError("down"))
    operations.retry([str(row.id)])
    assert QueuedJob.objects.get().fair_key == "tenant-9"


def test_a_chains_later_links_keep_their_fair_key():
    from django.db import transaction

    from django_jobguard import chain
    from django_jobguard.workflows import chains

    chain(TenantReport("acme", 1), TenantReport("acme", 2)).dispatch()
    (first,) = queue.claim(["default"], worker_id="w")
    assert first.fair_key == "tenant-acme"
    with transaction.atomic():
        assert queue.ack(first)
        chains.advance(first.payload, succeeded=True)
    assert QueuedJob.objects.get().fair_key == "tenant-acme"


def test_the_admin_shows_a_rows_fair_key_and_finds_rows_by_it(admin_client):
    from django.urls import reverse

    dispatch(jobs.Noop(), fair_key="tenant-42")
    dispatch(jobs.Noop(), fair_key="tenant-7")
    row = QueuedJob.objects.get(fair_key="tenant-42")
    page = admin_client.get(reverse("admin:django_jobguard_queuedjob_change", args=[row.id]))
    assert page.status_code == 200 and "tenant-42" in page.content.decode()
    found = admin_client.get(reverse("admin:django_jobguard_queuedjob_changelist"),
                             {"q": "tenant-42"})
    assert [r.id for r in found.context["cl"].result_list] == [row.id]


@override_settings(JOBGUARD=FAIR)
def test_a_fair_batch_is_one_claim_whose_rows_count_their_attempt_as_they_start():
    backlog({"a": 2, "b": 2})
    rows = queue.claim(["fair"], worker_id="w", limit=3, start=1)
    assert [r.fair_key for r in rows] == ["a", "b", "a"]
    assert [queue.claimed_ahead(r) for r in rows] == [True, True, True]
    assert set(QueuedJob.objects.filter(reserved_by="w").values_list("attempts", flat=True)) \
        == {0}
    assert queue.start(rows[0])
    assert QueuedJob.objects.get(id=rows[0].id).attempts == 1 and rows[0].attempts == 1


@pytest.mark.django_db(transaction=True)
def test_the_heartbeat_skips_a_row_its_own_ack_is_locking():
    """A fair batch acks its rows out of their physical order, and the worker's heartbeat
    renewing all of them deadlocked with the ack of one row and start of the next (seen in
    bench/fairness.py: the ack lost, its row stayed leased). Renewal now skips locked rows."""
    from django.db import connection, connections

    if not connection.features.has_select_for_update_skip_locked:
        pytest.skip("SQLite has no row locks: one writer at a time")
    backlog({"a": 1, "b": 1})
    rows = queue.claim(["fair"], worker_id="w", limit=2)
    other = connections.create_connection("default")
    try:
        other.set_autocommit(False)
        with other.cursor() as cursor:
            cursor.execute(f"SELECT 1 FROM {QueuedJob._meta.db_table} WHERE id = %s FOR UPDATE",
                           [QueuedJob._meta.pk.get_db_prep_value(rows[0].id, other)])
        assert queue.extend_leases("w", ids=[r.id for r in rows]) == 1  # no wait
    finally:
        other.rollback()
        other.close()
