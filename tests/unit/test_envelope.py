"""django_jobguard.envelope: a payload encoded once, decoded once, and a clear
:class:`PayloadError` for one no worker could run.

Covered elsewhere, not repeated here: what dispatch stores (tests/unit/test_jobs.py
``test_dispatch_stores_constructor_arguments_as_json``), the size limit measured in stored
UTF-8 bytes end to end (``test_payload_size_limit_counts_the_stored_utf8_bytes``), a corrupt
payload failing its job through the worker (tests/unit/test_worker.py
``test_corrupt_payload_goes_to_failed_jobs``), a ``retry_until`` out of the range of dates
failing once (tests/unit/test_pipeline.py) and a payload nested too deep to decode
(tests/unit/dialects/test_dialects.py).
"""

from __future__ import annotations

import datetime
import json

import pytest

from django_jobguard.envelope import Envelope, UniqueRef, encoded_size, unique_ref
from django_jobguard.exceptions import PayloadError

LOCK = {"key": "report:3", "store": "database", "owner": "f00d"}


# -- round trip --------------------------------------------------------------------------------


def test_an_envelope_survives_encode_and_decode():
    deadline = datetime.datetime(2026, 12, 5, 13, 0, tzinfo=datetime.timezone(
        datetime.timedelta(hours=1)))
    envelope = Envelope(args=[1, "é", [None, True]], kwargs={"n": 2.5},
                        retry_until=deadline, unique=UniqueRef(**LOCK))
    again = Envelope.decode(json.loads(envelope.encode()))
    assert again == envelope
    assert again.retry_until.utcoffset() == datetime.timedelta(hours=1)  # kept as written


def test_the_stored_text_is_compact_and_not_ascii_escaped():
    text = Envelope(args=["é"], kwargs={"a": 1}).encode()
    assert text == '{"args":["é"],"kwargs":{"a":1}}'


def test_an_empty_object_is_a_job_without_arguments():
    assert Envelope.decode({}) == Envelope()
    assert Envelope.decode({"args": [], "kwargs": {}, "retry_until": ""}).retry_until is None


def test_keys_it_does_not_know_are_kept_for_a_newer_release():
    payload = {"args": [1], "kwargs": {}, "__batch__": "b1", "future": {"x": 1}}
    envelope = Envelope.decode(payload)
    assert envelope.extra == {"__batch__": "b1", "future": {"x": 1}}
    assert json.loads(envelope.encode()) == payload
    # replace() changes what it is told and keeps the rest.
    moved = envelope.replace(args=[2])
    assert moved.args == [2] and moved.extra == envelope.extra and envelope.args == [1]


# -- bad payloads ------------------------------------------------------------------------------


@pytest.mark.parametrize(("payload", "message"), [
    ([1, 2], "expected a JSON object, got list."),
    ("{}", "expected a JSON object, got str."),
    (None, "expected a JSON object, got NoneType."),
    ({"args": "nope"}, "'args' must be a list and 'kwargs' an object."),
    ({"args": [], "kwargs": [1]}, "'args' must be a list and 'kwargs' an object."),
    ({"retry_until": "2026-12-05T12:00:00"},
     "'retry_until' must be an ISO 8601 time with a time zone, not '2026-12-05T12:00:00'."),
    ({"retry_until": "tomorrow"},
     "'retry_until' must be an ISO 8601 time with a time zone, not 'tomorrow'."),
    ({"retry_until": 1733400000},
     "'retry_until' must be an ISO 8601 time with a time zone, not 1733400000."),
    ({"retry_until": "0001-01-01T00:00:00+23:59"},
     "'retry_until' '0001-01-01T00:00:00+23:59' is out of the range of dates."),
])
def test_a_payload_no_worker_could_run_says_what_is_wrong(payload, message):
    with pytest.raises(PayloadError) as caught:
        Envelope.decode(payload)
    assert str(caught.value) == message


def test_a_malformed_unique_entry_is_no_lock_not_an_error():
    for unique in ("report:3", {"key": "k", "store": "database"}, {**LOCK, "owner": ""},
                   {**LOCK, "store": 5}):
        assert Envelope.decode({"args": [], "unique": unique}).unique is None


# -- raw payloads --------------------------------------------------------------------------------


def test_encoded_size_counts_the_utf8_bytes_of_the_compact_text():
    assert encoded_size({"args": [1]}) == len('{"args":[1]}') == 12
    assert encoded_size(["é"]) == len('[""]') + 2  # two bytes in UTF-8
    assert encoded_size(["😀"]) == len('[""]') + 4
    envelope = Envelope(args=["naïve", "日本"], kwargs={"k": "€"})
    assert encoded_size(envelope.as_json()) == len(envelope.encode().encode("utf-8"))


def test_unique_ref_is_found_even_in_a_payload_that_does_not_decode():
    """Operators clearing a corrupt row, and the worker failing it, still free its lock."""
    corrupt = {"args": "nope", "retry_until": "tomorrow", "unique": LOCK}
    with pytest.raises(PayloadError):
        Envelope.decode(corrupt)
    assert unique_ref(corrupt) == UniqueRef(**LOCK)


def test_unique_ref_of_a_payload_without_a_lock_is_none():
    assert unique_ref({"args": []}) is None
    assert unique_ref({"unique": {"key": "k"}}) is None
    assert unique_ref([LOCK]) is None
    assert unique_ref("not json at all") is None


@pytest.mark.parametrize("value", [
    {"args": [], "kwargs": {}},
    {"args": [1, 2.5, -0.0, 10**30, 1.1e-7, None, True], "kwargs": {"s": "é\u2028\x00\"\\/"}},
    {"unique": {"key": "k"}, "context": {"language": "fr"}, "retry_until": "2026-12-05T00:00Z"},
    [], {}, "text", 3, None,
])
def test_the_compact_encoder_writes_what_json_writes(value):
    """The payload text is encoded by a C encoder made once (envelope._compact): the same
    text as ``json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)``."""
    from django_jobguard import envelope

    reference = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
    assert envelope._compact(value) == reference(value)
