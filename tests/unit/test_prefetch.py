"""The prefetch buffer of threads and async slots (django_jobguard/worker/prefetch.py)."""

from __future__ import annotations

from types import SimpleNamespace

from django_jobguard.worker.prefetch import Prefetch


def _row(id_: int, *, queue: str = "default", kind: str = "sync") -> SimpleNamespace:
    return SimpleNamespace(id=id_, queue=queue, kind=kind)


def _buffer() -> Prefetch:
    return Prefetch(lambda row: row.kind == "async")


def test_nothing_is_prefetched_before_a_job_has_ended():
    assert _buffer().target(20) == 0


def test_the_target_is_one_row_per_slot_at_most_and_about_50_ms_of_work_per_slot():
    buffer = _buffer()
    buffer.finished(0.001)
    assert buffer.target(20) == 20  # millisecond jobs: one row per slot
    buffer = _buffer()
    buffer.finished(0.1)
    assert buffer.target(20) == 10  # 20 slots x 0.05 s / 0.1 s
    buffer = _buffer()
    buffer.finished(2.0)
    assert buffer.target(20) == 0  # slow jobs: none held where an idle worker could run them


def test_the_average_follows_recent_jobs():
    buffer = _buffer()
    buffer.finished(1.0)
    for _ in range(40):
        buffer.finished(0.01)
    assert buffer.target(4) == 4


def test_a_slot_takes_the_oldest_row_of_its_kind():
    buffer = _buffer()
    buffer.put([_row(1, kind="async"), _row(2), _row(3, kind="async"), _row(4)])
    assert buffer.take(is_async=False).id == 2
    assert buffer.take(is_async=True).id == 1
    assert buffer.count(is_async=True) == 1 and len(buffer) == 2
    assert buffer.ids() == {3, 4}
    assert buffer.take(is_async=False).id == 4
    assert buffer.take(is_async=False) is None


def test_drain_with_close_gives_everything_back_and_refuses_rows_from_then_on():
    buffer = _buffer()
    buffer.put([_row(1), _row(2)])
    assert [r.id for r in buffer.drain(close=True)] == [1, 2]
    late = [_row(3)]
    assert buffer.put(late) == late  # refused: the caller gives it back
    assert buffer.take(is_async=False) is None and not buffer.ids()


def test_the_rows_of_paused_queues_are_taken_out():
    buffer = _buffer()
    buffer.put([_row(1, queue="a"), _row(2, queue="b"), _row(3, queue="a")])
    assert buffer.queues() == {"a", "b"}
    assert [r.id for r in buffer.take_queues({"a"})] == [1, 3]
    assert buffer.ids() == {2}
