"""Property tests (hypothesis) of the rate-limit and circuit state machines.

1. The sliding window (stores/counters.py) against the exact reference model — the list of
   every admitted start: never more than ``limit`` in any window, refusals only when the
   reference is (nearly) full, ``retry_after`` exact, several limits all-or-nothing.
2. The circuit against a naive reference model written from the rules in the docs, with
   its invariants (nothing runs while open, one probe at a time, a success resets).
3. Both stores against the pure functions, step by step with explicit store times, so the
   database transactions and the Redis Lua scripts implement the very same machines.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from django_jobguard.stores import counters, get_store
from django_jobguard.stores.base import RateWindow

T0 = 1_800_000_000_000_000  # a store time in µs (2027)

# -- 1. the sliding window vs. every admitted start ---------------------------------------------

windows_config = st.lists(
    st.tuples(st.integers(1, 6), st.sampled_from([1_000, 60_000, 1_000_000, 2_000_000,
                                                  7_000_000])),
    min_size=1, max_size=3)


@st.composite
def rate_scenarios(draw):
    config = draw(windows_config)
    keys = [f"k{i}" for i in range(len(config))]
    windows = {key: limit_decay for key, limit_decay in zip(keys, config, strict=True)}
    longest = max(decay for _, decay in config)
    # An advance is a number of µs, or (kind, d): go to the next moment a counted hit expires
    # ("expiry") or the newest bucket stops taking hits ("bucket"), plus d in -1, 0, +1, so
    # that the exact boundaries are tried too.
    advances = st.one_of(st.integers(0, longest * 3 // 2),
                         st.tuples(st.sampled_from(["expiry", "bucket"]),
                                   st.sampled_from([-1, 0, 1])))
    steps = draw(st.lists(
        st.tuples(advances,
                  st.lists(st.sampled_from(keys), min_size=1, max_size=len(keys), unique=True)),
        min_size=1, max_size=60))
    return windows, steps


def advance_time(now: int, advance, logs: dict, windows: dict) -> int:
    """``now`` moved by ``advance`` (see :func:`rate_scenarios`)."""
    if not isinstance(advance, tuple):
        return now + advance
    kind, offset = advance
    if kind == "bucket":
        boundaries = [log[-1][0] + windows[key][1] // counters.BUCKETS
                      for key, log in logs.items() if log]
    else:
        boundaries = [b[1] + windows[key][1] for key, log in logs.items()
                      for b in counters.live(log, now, windows[key][1])]
    return max(now, min(boundaries, default=now) + offset)


def in_range(times: list[int], low: int, high: int) -> int:
    """How many ``times`` lie in ``(low, high]``."""
    return sum(1 for t in times if low < t <= high)


@settings(max_examples=300, deadline=None)
@given(rate_scenarios())
def test_sliding_window_against_every_admitted_start(scenario):
    windows, steps = scenario
    logs: dict[str, list] = {key: [] for key in windows}
    admitted: dict[str, list[int]] = {key: [] for key in windows}
    now = T0
    for advance, keys in steps:
        now = advance_time(now, advance, logs, windows)
        chosen = {key: windows[key] for key in keys}
        outcome = counters.hit_windows(logs, chosen, now)
        assert outcome.now == now
        each = {key: counters.hit_windows(logs, {key: chosen[key]}, now).allowed for key in keys}
        assert outcome.allowed == all(each.values())  # all-or-nothing is "every one admits"
        if outcome.allowed:
            for key, (limit, decay) in chosen.items():
                admitted[key].append(now)
                # Safety: the half-open window ending now holds at most `limit` starts.
                assert in_range(admitted[key], now - decay, now) <= limit
                logs[key] = outcome.logs[key]
            assert outcome.wait == 0 and outcome.blocked == ()
        else:
            assert set(outcome.blocked) == {key for key, ok in each.items() if not ok}
            for key in outcome.blocked:
                limit, decay = chosen[key]
                width = decay // counters.BUCKETS
                # Refused only if the reference is full within decay + one bucket's width.
                assert in_range(admitted[key], now - decay - width, now) >= limit
            # retry_after is exact: a slot for all of them then, not a microsecond earlier.
            assert outcome.wait > 0
            assert counters.hit_windows(logs, chosen, now + outcome.wait).allowed
            assert not counters.hit_windows(logs, chosen, now + outcome.wait - 1).allowed
        for key, (_, decay) in windows.items():
            assert len(counters.live(logs[key], now, decay)) <= counters.BUCKETS + 1


def test_a_fixed_window_would_allow_a_double_burst_but_the_sliding_window_does_not():
    """5 per 2 s: five starts at 1.9 s and five at 2.1 s fit two fixed windows."""
    logs: dict[str, list] = {"k": []}
    windows = {"k": (5, 2_000_000)}
    allowed = []
    for at in [1_900_000] * 5 + [2_100_000] * 5:
        outcome = counters.hit_windows(logs, windows, T0 + at)
        allowed.append(outcome.allowed)
        logs = outcome.logs if outcome.allowed else logs
    assert allowed == [True] * 5 + [False] * 5


def test_encoding_round_trips():
    log = [(T0, T0 + 5, 3), (T0 + 100, T0 + 100, 1)]
    assert counters.decode_log(counters.encode_log(log)) == log
    c = counters.Circuit(counters.HALF_OPEN, 7, T0 + 9, "owner-1")
    assert counters.decode_circuit(counters.encode_circuit(c)) == c
    assert counters.decode_circuit("") == counters.Circuit()


# -- 2. the circuit vs. a naive reference model ---------------------------------------------


@dataclass
class NaiveCircuit:
    """The documented rules, written out without the compact state."""

    max_attempts: int
    decay: int
    lease: int
    failure_times: list[int] = field(default_factory=list)  # in the current closed window
    open_until: int | None = None  # set while open or half-open
    probe_owner: str | None = None
    probe_until: int = 0
    failures_total: int = 0  # counted since the last success

    def reset(self) -> None:
        self.failure_times, self.open_until, self.probe_owner = [], None, None
        self.failures_total = 0

    def enter(self, now: int, owner: str) -> tuple[bool, bool]:
        """(admitted, as the probe)."""
        if self.open_until is None:
            if self.failure_times and now >= self.failure_times[0] + self.decay:
                self.reset()
            return True, False
        if now < self.open_until:
            return False, False
        if self.probe_owner not in (None, owner) and now < self.probe_until:
            return False, False
        self.probe_owner, self.probe_until = owner, now + self.lease
        return True, True

    def leave(self, now: int, owner: str, outcome: str) -> None:
        if outcome == "success":
            self.reset()
            return
        probing = self.open_until is not None and self.probe_owner == owner
        if outcome == "neutral":
            if probing:
                self.probe_owner = None
            return
        self.failures_total += 1
        if probing:
            self.open_until, self.probe_owner = now + self.decay, None
        elif self.open_until is None:
            if self.failure_times and now >= self.failure_times[0] + self.decay:
                self.failure_times, self.failures_total = [], 1
            self.failure_times.append(now)
            if len(self.failure_times) >= self.max_attempts:
                self.open_until, self.failure_times = now + self.decay, []

    @property
    def state(self) -> str:
        if self.open_until is None:
            return counters.CLOSED
        return counters.HALF_OPEN if self.probe_owner is not None else counters.OPEN


class CircuitMachine(RuleBasedStateMachine):
    """Random jobs entering and leaving one circuit, against :class:`NaiveCircuit`."""

    @initialize(max_attempts=st.integers(1, 5), decay=st.integers(1, 5_000_000),
                lease=st.integers(1, 5_000_000))
    def setup(self, max_attempts, decay, lease):
        self.settings = {"max_attempts": max_attempts, "decay": decay}
        self.lease = lease
        self.model = NaiveCircuit(max_attempts, decay, lease)
        self.c = counters.Circuit()
        self.now = T0
        self.running: set[str] = set()  # owners admitted and not yet left
        self.probe_holder: tuple[str, int] | None = None  # (owner, lease end) per the machine

    @rule(advance=st.integers(0, 6_000_000))
    def wait(self, advance):
        self.now += advance

    @rule(offset=st.sampled_from([-1, 0, 1]))
    def wait_for_the_deadline(self, offset):
        """Go to the circuit's own deadline (window end, open until, probe lease) ± 1 µs."""
        self.now = max(self.now, self.c.until + offset)

    @rule(owner=st.sampled_from("abcdef"))
    def enter(self, owner):
        was_open_until = self.c.until if self.c.state == counters.OPEN else None
        entry = counters.enter(self.c, self.now, owner=owner, probe_lease=self.lease)
        expected = self.model.enter(self.now, owner)
        assert (entry.admitted, entry.probe) == expected
        if was_open_until is not None and self.now < was_open_until:
            assert not entry.admitted  # nothing runs while open
        if entry.probe:
            if self.probe_holder and self.probe_holder[0] != owner:
                assert self.now >= self.probe_holder[1]  # one probe at a time (or lease over)
            self.probe_holder = (owner, self.now + self.lease)
        if not entry.admitted:
            assert entry.wait > 0
        self.c = entry.circuit
        if entry.admitted:
            self.running.add(owner)

    @rule(data=st.data(), outcome=st.sampled_from([counters.SUCCESS, counters.FAILURE,
                                                   counters.NEUTRAL]))
    def leave(self, data, outcome):
        if not self.running:
            return
        owner = data.draw(st.sampled_from(sorted(self.running)))
        self.running.discard(owner)
        self.c = counters.leave(self.c, self.now, owner=owner, outcome=outcome,
                                **self.settings)
        self.model.leave(self.now, owner, outcome)
        if outcome == counters.SUCCESS:
            assert self.c == counters.Circuit()  # a real success resets
            self.probe_holder = None
        elif self.probe_holder and self.probe_holder[0] == owner:
            self.probe_holder = None

    @invariant()
    def agrees_with_the_model(self):
        if not hasattr(self, "model"):
            return
        # An open circuit whose probe gave up (neutral) is "half-open with no probe" in the
        # machine and "open, decay over" in the model: both let the next job probe.
        state = counters.OPEN if self.c.state == counters.HALF_OPEN and not self.c.probe \
            else self.c.state
        assert state == self.model.state
        assert self.c.failures == self.model.failures_total or self.c.state == counters.CLOSED
        if self.c.state == counters.CLOSED:
            live = self.c.failures if self.now < self.c.until else 0
            model_live = len(self.model.failure_times) if self.model.failure_times and \
                self.now < self.model.failure_times[0] + self.model.decay else 0
            assert live == model_live
            assert live < self.settings["max_attempts"]


TestCircuitMachine = CircuitMachine.TestCase
TestCircuitMachine.settings = settings(max_examples=1000, stateful_step_count=30, deadline=None)


# -- 3. both stores implement the same machines -------------------------------------------------

store_settings = settings(max_examples=25, deadline=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.django_db
@settings(store_settings, max_examples=60)
@given(scenario=rate_scenarios())
def test_stores_decide_rates_like_the_pure_machine(store_alias, scenario):
    windows, steps = scenario
    store = get_store(store_alias)
    # On a Cluster the windows share a hash tag: a hit over one slot is one script, exact as
    # on a single server. Windows in several slots are hit slot by slot (their refused hits
    # given back: test_topologies.py), which may name another window or wait a little longer
    # than one server would (docs/scale-out.md), so this property holds for one slot only.
    name = f"prop-{uuid.uuid4().hex}"
    tag = "{" + name + "}" if store_alias == "redis-cluster" else name
    prefix = f"jobguard:rate:{tag}:"
    # Decays of a minute and more: Redis expires keys on its real clock.
    windows = {key: (limit, 60_000_000 + decay) for key, (limit, decay) in windows.items()}
    logs: dict[str, list] = {key: [] for key in windows}
    now = T0
    for advance, keys in steps:
        now = advance_time(now, advance if isinstance(advance, tuple) else advance * 60, logs,
                           windows)
        chosen = {key: windows[key] for key in keys}
        expected = counters.hit_windows(logs, chosen, now)
        got = store.hit_rate_limits(
            [RateWindow(prefix + key, limit, decay / 1_000_000)
             for key, (limit, decay) in chosen.items()], _at=now)
        assert got.allowed == expected.allowed
        assert got.retry_after == expected.wait / 1_000_000
        assert got.blocked == tuple(prefix + key for key in expected.blocked)
        assert got.now.timestamp() * 1_000_000 == pytest.approx(expected.now, abs=1)
        if expected.allowed:
            logs.update(expected.logs)
    for key in windows:
        store.reset_throttle(prefix + key)


owners = st.sampled_from("ab")
single_op = st.tuples(
    st.one_of(st.integers(0, 90_000_000), st.sampled_from([-1, 0, 1])),  # µs, or deadline ± d
    st.sampled_from(["enter", counters.SUCCESS, counters.FAILURE, counters.NEUTRAL]), owners)
small = st.integers(2, 1_000_000)
# A phrase the circuit cares about: at the deadline, one job enters, another tries, one leaves.
probe_phrase = st.tuples(st.sampled_from([-1, 0, 1]), owners, small, owners, small,
                         st.sampled_from([counters.SUCCESS, counters.FAILURE,
                                          counters.NEUTRAL]), owners).map(
    lambda p: [(p[0], "enter", p[1]), (p[2], "enter", p[3]), (p[4], p[5], p[6])])
# Enough failures in a row to open it.
trip_phrase = st.lists(st.tuples(small, st.just(counters.FAILURE), owners), min_size=3,
                       max_size=3)
circuit_ops = st.lists(st.one_of(single_op.map(lambda op: [op]), probe_phrase, trip_phrase),
                       min_size=1, max_size=15).map(lambda parts: [op for p in parts for op in p])


@pytest.mark.django_db
@settings(store_settings, max_examples=80)
@given(max_attempts=st.integers(1, 3), ops=circuit_ops)
def test_stores_run_circuits_like_the_pure_machine(store_alias, max_attempts, ops):
    store = get_store(store_alias)
    key = f"jobguard:circuit:prop-{uuid.uuid4().hex}"
    decay, lease = 60_000_000, 120_000_000
    c = counters.Circuit()
    now = T0
    for advance, op, owner in ops:
        now = max(now, c.until + advance) if advance in (-1, 0, 1) else now + advance
        if op == "enter":
            entry = counters.enter(counters.load_circuit(c, now, decay), now, owner=owner,
                                   probe_lease=lease)
            got = store.circuit_enter(key, owner=owner, max_attempts=max_attempts,
                                      decay=decay / 1e6, probe_lease=lease / 1e6, _at=now)
            assert (got.admitted, got.probe) == (entry.admitted, entry.probe)
            assert got.retry_after == entry.wait / 1_000_000
            c = entry.circuit
        else:
            c = counters.leave(counters.load_circuit(c, now, decay), now, owner=owner,
                               outcome=op, max_attempts=max_attempts, decay=decay)
            got = store.circuit_leave(key, owner=owner, outcome=op, max_attempts=max_attempts,
                                      decay=decay / 1e6, _at=now)
        assert (got.state, got.failures) == (c.state, c.failures)
        assert got.until == (counters_datetime(c.until) if c.until else None)
    store.reset_throttle(key)


def counters_datetime(value: int):
    import datetime

    return datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(
        microseconds=value)


# -- 4. the stores' one microsecond <-> datetime conversion ------------------------------------


@given(st.integers(0, 2**53))
def test_microseconds_round_trip_exactly(value):
    moment = counters.from_us(value)
    assert moment.tzinfo is not None and counters.to_us(moment) == value
    assert counters.from_us(str(value)) == counters.from_us(str(value).encode()) == moment


@pytest.mark.parametrize("missing", [None, "", b""])
def test_a_missing_microsecond_value_is_none(missing):
    assert counters.from_us_or_none(missing) is None
    assert counters.from_us_or_none("0") == counters.EPOCH
