"""The rate-limit window and the exception circuit as pure state machines.

Both stores keep exactly this state and apply exactly these rules: the database store runs
these functions under row locks; the Redis store's Lua scripts mirror them line for line (the
property tests run both stores against these functions). Times are integer microseconds of
the store's clock, so Python and Lua compute the same numbers.

**Rate window** — a bucketed sliding log. The hits admitted in the last ``decay`` are kept as
buckets ``(first, last, count)``; a hit joins the newest bucket if it came less than
``decay / BUCKETS`` after that bucket's first hit. A bucket counts until its *last* hit is
``decay`` old. A start is admitted only if fewer than ``limit`` hits are counted, so no
half-open window of length ``decay`` ever holds more than ``limit`` admissions (there is no
burst of ``2 * limit`` at a window edge, as with a fixed window, nor of ``2 * limit - 1`` as
with a token bucket / GCRA). A hit is forgotten between ``decay`` and ``decay * (1 + 1 /
BUCKETS)`` after it happened, and the state is at most ``BUCKETS + 1`` buckets.

**Circuit** — ``closed`` counts failures in a window that starts at the first failure and
lasts ``decay``; ``max_attempts`` failures open it for ``decay``. After that the first job to
arrive becomes the only probe (``half-open``, with a lease); its real success closes the
circuit, its failure opens it again, and anything else (released, deferred, dropped) hands the
probe to the next job. Any real success closes the circuit and forgets the failures. An open
circuit nobody probes is forgotten a day (``KEEP_OPEN``) after its decay ended.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

BUCKETS = 60

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half-open"
SUCCESS, FAILURE, NEUTRAL = "success", "failure", "neutral"

KEEP_OPEN = 86_400_000_000  # µs an idle open circuit is remembered past its decay (a day)

Bucket = tuple[int, int, int]  # (first hit, last hit, hits) in microseconds


def us(seconds: float) -> int:
    """Seconds → whole microseconds (what the stores and scripts compute with)."""
    return int(round(seconds * 1_000_000))


EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def to_us(moment: datetime.datetime) -> int:
    """An aware datetime → whole microseconds since the epoch (the stores' time unit)."""
    return (moment - EPOCH) // datetime.timedelta(microseconds=1)


def from_us(value: int | str | bytes) -> datetime.datetime:
    """Microseconds since the epoch (an int, or a script's or hash's digits) → aware UTC
    datetime, exactly (no float rounding)."""
    return EPOCH + datetime.timedelta(microseconds=int(value))


def from_us_or_none(value: int | str | bytes | None) -> datetime.datetime | None:
    """:func:`from_us`, but a missing value (``None`` or empty, e.g. a hash field that is not
    there) is ``None``."""
    if value is None or value in ("", b""):
        return None
    return from_us(value)


# -- rate window ------------------------------------------------------------------------------


def live(log: Iterable[Bucket], now: int, decay: int) -> list[Bucket]:
    """The buckets that still count at ``now``."""
    return [b for b in log if b[1] > now - decay]


def wait_for_slot(log: list[Bucket], now: int, limit: int, decay: int) -> int:
    """Microseconds until one more hit is allowed (0 = now); ``log`` must be :func:`live`."""
    need = sum(b[2] for b in log) - limit + 1
    if need <= 0:
        return 0
    for _first, last, hits in log:
        need -= hits
        if need <= 0:
            return last + decay - now
    return 0  # unreachable for limit >= 1


def add_hit(log: list[Bucket], now: int, decay: int) -> list[Bucket]:
    """``log`` (live) with one more hit at ``now``."""
    width = decay // BUCKETS
    if log and now < log[-1][0] + width:
        first, _last, hits = log[-1]
        return [*log[:-1], (first, now, hits + 1)]
    return [*log, (now, now, 1)]


@dataclass(frozen=True)
class RateOutcome:
    """What :func:`hit_windows` decided at ``now``."""

    allowed: bool
    now: int
    wait: int  # microseconds until every blocking window has a slot (0 when allowed)
    blocked: tuple[str, ...]
    logs: dict[str, list[Bucket]]  # the new (or, when refused, the pruned) state per key


def merge_windows(windows: Iterable[tuple[str, int, int]]) -> dict[str, tuple[int, int]]:
    """``(key, limit, decay)`` triples → ``{key: (limit, decay)}``; a key listed twice keeps
    the smaller limit (one start is one hit per key, however many limits name it)."""
    merged: dict[str, tuple[int, int]] = {}
    for key, limit, decay in windows:
        if key in merged:
            old_limit, old_decay = merged[key]
            merged[key] = (min(limit, old_limit), max(decay, old_decay))
        else:
            merged[key] = (limit, decay)
    return merged


def hit_windows(logs: Mapping[str, list[Bucket]], windows: Mapping[str, tuple[int, int]],
                now: int) -> RateOutcome:
    """All-or-nothing: admit one start if every window has a slot, and then hit them all;
    otherwise change nothing and say how long until all of them have one."""
    newest = max((b[1] for log in logs.values() for b in log), default=0)
    now = max(now, newest)  # a clock that stepped back must not reorder the log
    pruned = {key: live(logs.get(key, ()), now, decay) for key, (_, decay) in windows.items()}
    wait, blocked = 0, []
    for key in sorted(windows):
        limit, decay = windows[key]
        needed = wait_for_slot(pruned[key], now, limit, decay)
        if sum(b[2] for b in pruned[key]) >= limit:
            blocked.append(key)
            wait = max(wait, needed)
    if blocked:
        return RateOutcome(False, now, wait, tuple(blocked), pruned)
    updated = {key: add_hit(pruned[key], now, windows[key][1]) for key in windows}
    return RateOutcome(True, now, 0, (), updated)


def encode_log(log: Iterable[Bucket]) -> str:
    """The text form both stores keep: ``first,last,hits;…``."""
    return ";".join(f"{first},{last},{hits}" for first, last, hits in log)


def decode_log(text: str | None) -> list[Bucket]:
    out: list[Bucket] = []
    for part in (text or "").split(";"):
        if part:
            first, last, hits = (int(x) for x in part.split(","))
            out.append((first, last, hits))
    return out


# -- circuit ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Circuit:
    """A circuit's state. ``until`` is the failure window's end (closed), the end of the open
    period (open) or the probe's lease (half-open)."""

    state: str = CLOSED
    failures: int = 0
    until: int = 0
    probe: str = ""

    @property
    def is_fresh(self) -> bool:
        return self.state == CLOSED and self.failures == 0


@dataclass(frozen=True)
class Entry:
    """What :func:`enter` decided for one job."""

    circuit: Circuit
    admitted: bool
    probe: bool = False
    wait: int = 0  # microseconds until the caller should ask again (when not admitted)
    changed: bool = field(default=False, compare=False)


def enter(c: Circuit, now: int, *, owner: str, probe_lease: int) -> Entry:
    """May a job run? Closed: yes. Open: not before ``until``; then the caller becomes the
    probe. Half-open: only the probe (or whoever arrives after its lease ran out)."""
    if c.state == CLOSED:
        if c.failures and now >= c.until:
            return Entry(Circuit(), True, changed=True)  # the failure window ran out
        return Entry(c, True)
    if c.state == OPEN and now < c.until:
        return Entry(c, False, wait=c.until - now)
    if c.state == HALF_OPEN and c.probe and c.probe != owner and now < c.until:
        return Entry(c, False, wait=c.until - now)
    probe = Circuit(HALF_OPEN, c.failures, now + probe_lease, owner)
    return Entry(probe, True, probe=True, changed=True)


def leave(c: Circuit, now: int, *, owner: str, outcome: str, max_attempts: int,
          decay: int) -> Circuit:
    """The circuit after a job's ``outcome``: ``success`` (a real one), ``failure`` (a counted
    exception) or ``neutral`` (released, deferred, dropped, or an exception not counted)."""
    if outcome == SUCCESS:
        return Circuit()
    is_probe = c.state == HALF_OPEN and c.probe == owner
    if outcome == NEUTRAL:
        return Circuit(HALF_OPEN, c.failures, now, "") if is_probe else c
    if outcome != FAILURE:
        raise ValueError(f"unknown circuit outcome {outcome!r}")
    if is_probe:
        return Circuit(OPEN, c.failures + 1, now + decay, "")
    if c.state == CLOSED:
        if c.failures == 0 or now >= c.until:
            c = Circuit(CLOSED, 0, now + decay, "")
        failures = c.failures + 1
        if failures >= max_attempts:
            return Circuit(OPEN, failures, now + decay, "")
        return Circuit(CLOSED, failures, c.until, "")
    # A job let in before the circuit opened failed later: count it, the probe decides.
    return Circuit(c.state, c.failures + 1, c.until, c.probe)


def load_circuit(c: Circuit, now: int, decay: int) -> Circuit:
    """``c`` as stored with window ``decay``, or a fresh circuit once it may be forgotten."""
    expires = circuit_expiry(c, decay)
    return Circuit() if expires is None or now >= expires else c


def effective_state(c: Circuit, now: int) -> str:
    """What an operator should see: an open circuit past ``until`` lets the next job probe."""
    if c.state == OPEN and now >= c.until:
        return HALF_OPEN
    if c.state == CLOSED and c.failures and now >= c.until:
        return CLOSED
    return c.state


def circuit_expiry(c: Circuit, decay: int) -> int | None:
    """When the stored state may be forgotten (``None`` = delete it now): a closed window at its
    end; an open / half-open circuit ``KEEP_OPEN`` (or ``decay``, if longer) after it could have
    closed, so that a probe still goes first when jobs come back hours later."""
    if c.is_fresh:
        return None
    if c.state == CLOSED:
        return c.until
    return c.until + max(decay, KEEP_OPEN)


def encode_circuit(c: Circuit) -> str:
    return f"{c.state};{c.failures};{c.until};{c.probe}"


def decode_circuit(text: str | None) -> Circuit:
    if not text:
        return Circuit()
    state, failures, until, probe = text.split(";", 3)
    return Circuit(state, int(failures), int(until), probe)


# -- what operators see (Store.throttles) -------------------------------------------------------


def describe_rate(log: list[Bucket], now: int, decay: int) -> tuple[int, int] | None:
    """``(hits counted, when the oldest of them stops counting)`` or ``None`` if empty."""
    counted = live(log, now, decay)
    if not counted:
        return None
    return sum(b[2] for b in counted), counted[0][1] + decay


def describe_circuit(c: Circuit, now: int, decay: int) -> Circuit | None:
    """The circuit as it stands at ``now`` (state made effective), or ``None`` if forgotten."""
    c = load_circuit(c, now, decay)
    if c.is_fresh:
        return None
    if c.state == CLOSED and now >= c.until:
        return None  # its failure window ran out
    return Circuit(effective_state(c, now), c.failures, c.until, c.probe)
