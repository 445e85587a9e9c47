"""Time-slice agreements: a project is guaranteed N GPUs of a cluster during windows.

A window is either fixed (UTC Unix seconds) or a weekly recurrence at a local wall-clock time in
an IANA time zone. Local times follow the zone's rules: across a DST change the window keeps its
local time and its UTC instant shifts. A local start inside a spring-forward gap starts at the
first valid instant after the gap; an ambiguous one (fall-back) takes the first occurrence
(fold=0). Durations are elapsed seconds, so a window spanning a change is as long as any other.

All intervals are half-open [start, end) in integer UTC seconds. Queries are bounded to 400 days
so that a weekly recurrence never expands without limit.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from enum import IntEnum
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

DAY = 86_400
MAX_DURATION = 7 * DAY  # longer than a week would make a weekly window overlap itself
MAX_RANGE = 400 * DAY


class AgreementInvalid(ValueError):
    """An agreement or a query that cannot be evaluated (bad window, range too long)."""


class Weekday(IntEnum):
    """Numbered like `date.weekday()`, so a local date's weekday compares directly."""

    MON = 0
    TUE = 1
    WED = 2
    THU = 3
    FRI = 4
    SAT = 5
    SUN = 6


Interval = tuple[int, int]


def _check_int(name: str, value: object) -> int:
    # bool is an int subclass; True as a timestamp is a bug, not one second past the epoch.
    if not isinstance(value, int) or isinstance(value, bool):
        raise AgreementInvalid(f"{name} must be an integer, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class FixedWindow:
    """One window [start, end) in UTC Unix seconds."""

    start: int
    end: int

    def __post_init__(self) -> None:
        _check_int("window start", self.start)
        _check_int("window end", self.end)
        if self.end <= self.start:
            raise AgreementInvalid(f"fixed window ends at {self.end}, not after its start {self.start}")


@dataclass(frozen=True, slots=True)
class WeeklyWindow:
    """Every listed weekday at hour:minute local time in `time_zone`, for `duration` seconds.

    Occurrences count only inside [valid_from, valid_until) (UTC Unix seconds) and are clipped to it.
    """

    weekdays: frozenset[Weekday]
    hour: int
    minute: int
    duration: int
    time_zone: str
    valid_from: int
    valid_until: int

    def __post_init__(self) -> None:
        days = frozenset(self.weekdays)
        if not days:
            raise AgreementInvalid("weekly window has no weekdays")
        if not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= 6 for d in days):
            raise AgreementInvalid(f"weekdays are 0 (Monday) to 6 (Sunday), got {sorted(days)!r}")
        object.__setattr__(self, "weekdays", frozenset(Weekday(d) for d in days))
        if not 0 <= _check_int("hour", self.hour) <= 23:
            raise AgreementInvalid(f"hour is 0 to 23, got {self.hour}")
        if not 0 <= _check_int("minute", self.minute) <= 59:
            raise AgreementInvalid(f"minute is 0 to 59, got {self.minute}")
        if not 1 <= _check_int("duration", self.duration) <= MAX_DURATION:
            raise AgreementInvalid(f"duration is 1 to {MAX_DURATION} seconds (7 days), got {self.duration}")
        try:
            ZoneInfo(self.time_zone)
        except (ZoneInfoNotFoundError, ValueError, TypeError, OSError):  # "Europe" is a directory
            raise AgreementInvalid(f"unknown time zone {self.time_zone!r}") from None
        _check_int("valid_from", self.valid_from)
        _check_int("valid_until", self.valid_until)
        if self.valid_until <= self.valid_from:
            raise AgreementInvalid(
                f"weekly window is valid until {self.valid_until}, not after valid_from {self.valid_from}"
            )

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.time_zone)  # ZoneInfo caches by name


Window = FixedWindow | WeeklyWindow


@dataclass(frozen=True, slots=True)
class Agreement:
    """`project` is guaranteed `gpus` GPUs of `cluster` whenever `window` is open."""

    agreement_id: str
    project: str
    cluster: str
    gpus: int
    window: Window

    def __post_init__(self) -> None:
        for name in ("agreement_id", "project", "cluster"):
            if not getattr(self, name):
                raise AgreementInvalid(f"agreement {name} must not be empty")
        if _check_int("gpus", self.gpus) < 1:
            raise AgreementInvalid(f"agreement {self.agreement_id} guarantees {self.gpus} GPUs; at least 1")


@dataclass(frozen=True, slots=True)
class Overbooking:
    """The first instant at which granting the candidate exceeds the cluster's GPUs."""

    at: int
    total_gpus: int
    cluster_gpus: int
    conflicting: tuple[str, ...]  # ids of the existing agreements active at `at`, sorted


def _check_range(start: int, end: int) -> None:
    if end < start:
        raise AgreementInvalid(f"range ends at {end}, before its start {start}")
    if end - start > MAX_RANGE:
        raise AgreementInvalid(f"range of {end - start} seconds is longer than 400 days ({MAX_RANGE} s)")


def _offset(instant: int, zone: ZoneInfo) -> timedelta | None:
    return datetime.fromtimestamp(instant, zone).utcoffset()


def _local_start(day: date, hour: int, minute: int, zone: ZoneInfo) -> int:
    """The UTC instant of hour:minute local on `day`, resolving gaps and folds as documented."""
    wall = datetime(day.year, day.month, day.day, hour, minute, tzinfo=zone)
    first = int(wall.timestamp())
    second = int(wall.replace(fold=1).timestamp())
    if first <= second:  # equal: an ordinary time; less: ambiguous, fold=0 is the earlier
        return first
    # In a gap PEP 495 maps fold=0 with the offset before the change (later in UTC) and fold=1 with
    # the offset after it, so the change lies in (second, first]: find its first second.
    after = _offset(first, zone)
    lo, hi = second, first
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _offset(mid, zone) == after:
            hi = mid
        else:
            lo = mid
    return hi


def _merged(intervals: Iterable[Interval]) -> list[Interval]:
    # An agreement covers an instant or not: overlapping or touching pieces are one interval.
    merged: list[Interval] = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], e))
        else:
            merged.append((s, e))
    return merged


def occurrences(window: Window, start: int, end: int) -> list[Interval]:
    """The window's UTC intervals that overlap [start, end), clipped to its validity, sorted.

    Intervals are not clipped to [start, end): an occurrence that began earlier is returned whole.
    Overlapping or touching occurrences of one weekly window are merged.
    """
    _check_range(start, end)
    if isinstance(window, FixedWindow):
        return [(window.start, window.end)] if window.start < end and start < window.end else []
    lo, hi = max(start, window.valid_from), min(end, window.valid_until)
    if lo >= hi:
        return []
    zone = window.zone
    # An occurrence overlapping [lo, hi) starts after lo - duration; a day of margin on either side
    # absorbs the zone's offset and a start pushed past a gap.
    day = datetime.fromtimestamp(lo - window.duration, zone).date() - timedelta(days=1)
    last = datetime.fromtimestamp(hi, zone).date() + timedelta(days=1)
    found: list[Interval] = []
    while day <= last:
        if day.weekday() in window.weekdays:
            s = _local_start(day, window.hour, window.minute, zone)
            e = s + window.duration
            if s < hi and lo < e:
                found.append((max(s, window.valid_from), min(e, window.valid_until)))
        day += timedelta(days=1)
    return _merged(found)


def _covers(window: Window, at: int) -> bool:
    return bool(occurrences(window, at, at + 1))


def active_at(agreements: Iterable[Agreement], cluster: str, at: int) -> list[Agreement]:
    """The agreements on `cluster` whose window covers instant `at` (start inclusive, end exclusive)."""
    return [a for a in agreements if a.cluster == cluster and _covers(a.window, at)]


def guaranteed_gpus(agreements: Iterable[Agreement], project: str, cluster: str, at: int) -> int:
    """GPUs of `cluster` guaranteed to `project` at instant `at`."""
    return sum(a.gpus for a in active_at(agreements, cluster, at) if a.project == project)


def find_overbooking(
    existing: Sequence[Agreement],
    candidate: Agreement,
    cluster_gpus: int,
    horizon_start: int,
    horizon_end: int,
) -> Overbooking | None:
    """Whether granting `candidate` makes the guarantees on its cluster exceed `cluster_gpus`.

    Checks every instant of [horizon_start, horizon_end) (at most 400 days; for a weekly candidate
    pass its validity, or 400-day slices of it). Only instants where the candidate is active count:
    elsewhere granting it changes nothing. Sweeps the interval endpoints; the total changes only
    there, so the first endpoint over capacity is the first instant over capacity.
    """
    if _check_int("cluster_gpus", cluster_gpus) < 0:
        raise AgreementInvalid(f"cluster has {cluster_gpus} GPUs; at least 0")
    _check_range(horizon_start, horizon_end)
    # (time, change in GPUs, agreement id or None for the candidate)
    events: list[tuple[int, int, str | None]] = []

    def add(agreement: Agreement, key: str | None) -> None:
        for s, e in occurrences(agreement.window, horizon_start, horizon_end):
            s, e = max(s, horizon_start), min(e, horizon_end)
            events.extend(((s, agreement.gpus, key), (e, -agreement.gpus, key)))

    add(candidate, None)
    if not events:
        return None
    for agreement in existing:
        if agreement.cluster == candidate.cluster:
            add(agreement, agreement.agreement_id)
    events.sort(key=lambda event: event[0])

    total, candidate_open = 0, 0
    open_ids: Counter[str] = Counter()
    i = 0
    while i < len(events):
        at = events[i][0]
        # Apply every change at this second before judging it: ends and starts coincide at touches.
        while i < len(events) and events[i][0] == at:
            _, delta, key = events[i]
            total += delta
            step = 1 if delta > 0 else -1
            if key is None:
                candidate_open += step
            else:
                open_ids[key] += step
            i += 1
        if candidate_open and total > cluster_gpus:
            conflicting = tuple(sorted(key for key, count in open_ids.items() if count > 0))
            return Overbooking(at=at, total_gpus=total, cluster_gpus=cluster_gpus, conflicting=conflicting)
    return None
