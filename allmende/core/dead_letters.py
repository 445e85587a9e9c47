"""The dead-letter topic read back: refused records listed by kind, and re-driven once mended.

A refusal whose fix is an admin's (a project, cluster or GPU type the plan did not declare yet:
`domain.usage_checks.PLAN_FIXABLE`) loses nothing: once the plan declares it, the refused job
events are sent again to the job-events topic, and metering is order-free, so the job is then
charged exactly as if they had come on time. A re-drive sends the original record, read at its
place on its source topic (topics are kept forever) and checked against the letter's SHA-256, not
the letter's bounded prefix. It is safe twice: the meter takes a job event once per event id. A
re-driven record carries a header naming the letter's place, so a later refusal of it is traced
back.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from kafka import KafkaConsumer, TopicPartition

from allmende.core.kafka_reading import read_to_end, replaying_consumer
from allmende.core.replay import make_producer
from allmende.core.settings import Settings
from allmende.domain.usage_checks import PLAN_FIXABLE
from allmende.schemas.dead_letter import DeadLetter

REDRIVEN_FROM = "allmende-redriven-from"  # header: "<dead-letter topic>/<partition>@<offset>"


@dataclass(frozen=True)
class Letter:
    """A dead letter and its own place on the dead-letter topic."""

    offset: int
    letter: DeadLetter


def letter_of(record: Any) -> Letter | None:
    """The dead letter a record of the topic holds, at its offset; None for a record that is none."""
    try:
        return Letter(record.offset, DeadLetter.model_validate_json(record.value))
    except ValueError:
        return None


def mended_by_plan(stage: str, kind: str) -> bool:
    """Whether an admin mends this refusal by declaring what the plan lacks, then re-drives it."""
    return stage == "meter" and kind in PLAN_FIXABLE


def read_letters(settings: Settings, timeout: float = 30.0) -> list[Letter]:
    """Every dead letter on the topic, oldest first (a record that is no letter is skipped)."""
    tp = TopicPartition(settings.dead_letter_topic, 0)
    consumer, _ = replaying_consumer(settings.kafka_bootstrap_servers, [tp])
    letters: list[Letter] = []

    def keep(record: Any) -> None:
        found = letter_of(record)
        if found is not None:
            letters.append(found)

    try:
        read_to_end(consumer, tp, keep, timeout)
    finally:
        consumer.close(autocommit=False)
    return letters


def redrivable(letter: DeadLetter, settings: Settings) -> bool:
    """Only the meter's refusals of job events go back to the job-events topic."""
    return letter.stage == "meter" and letter.source_topic == settings.job_events_topic


@dataclass(frozen=True)
class Redriven:
    sent: int
    skipped: list[tuple[int, str]]  # (letter offset, why it was not sent)


def redrive(
    settings: Settings,
    letters: Sequence[Letter],
    on_each: Callable[[], None] | None = None,
    timeout: float = 30.0,
) -> Redriven:
    """Send each letter's original record to the job-events topic again, as it was (key, value)."""
    consumer = KafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap_servers, group_id=None, enable_auto_commit=False
    )
    producer = make_producer(settings.kafka_bootstrap_servers)
    skipped: list[tuple[int, str]] = []
    futures = []
    try:
        for item in letters:
            letter = item.letter
            if not redrivable(letter, settings):
                skipped.append(
                    (item.offset, f"a {letter.stage} refusal of {letter.source_topic}: not re-drivable")
                )
            else:
                found = _original(consumer, letter, timeout)
                if isinstance(found, str):
                    skipped.append((item.offset, found))
                else:
                    key, value = found
                    place = f"{settings.dead_letter_topic}/0@{item.offset}".encode()
                    futures.append(
                        producer.send(
                            settings.job_events_topic, key=key, value=value, headers=[(REDRIVEN_FROM, place)]
                        )
                    )
            if on_each is not None:
                on_each()
        producer.flush(timeout=timeout)
        for future in futures:
            future.get(timeout=timeout)  # acknowledged by the broker, or this raises
    finally:
        producer.close(timeout=5)
        consumer.close(autocommit=False)
    return Redriven(len(futures), skipped)


def _original(
    consumer: KafkaConsumer, letter: DeadLetter, timeout: float
) -> tuple[bytes | None, bytes] | str:
    """The refused record's key and value, read at its place; or why it cannot be."""
    tp = TopicPartition(letter.source_topic, letter.source_partition)
    consumer.assign([tp])
    consumer.seek(tp, letter.source_offset)
    polled = consumer.poll(timeout_ms=int(timeout * 1000), max_records=1).get(tp, [])
    if not polled or polled[0].offset != letter.source_offset:
        return f"its record {tp.topic}/{tp.partition}@{letter.source_offset} is no longer on the topic"
    record = polled[0]
    value = record.value or b""
    if letter.value_sha256 is not None and hashlib.sha256(value).hexdigest() != letter.value_sha256:
        return f"the record at {tp.topic}/{tp.partition}@{letter.source_offset} is not the one refused"
    return record.key, value


def select(
    letters: Iterable[Letter],
    codes: Sequence[str] = (),
    stages: Sequence[str] = (),
    offsets: Sequence[int] = (),
) -> list[Letter]:
    """The letters of any of the codes, stages and offsets given (each filter only when given)."""
    return [
        item
        for item in letters
        if (not codes or item.letter.code in codes)
        and (not stages or item.letter.stage in stages)
        and (not offsets or item.offset in offsets)
    ]


class RefusedLetters:
    """The dead-letter topic followed for the API: counts per (stage, code) and the newest letters.

    Bounded whatever the topic holds: the counts have one entry per kind of refusal, the letters
    are the newest KEEP (the whole topic stays readable with `allmende dead-letters list`).
    """

    KEEP = 500

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._tp = TopicPartition(settings.dead_letter_topic, 0)
        self._consumer: KafkaConsumer | None = None
        self._reading = threading.Lock()  # one follow at a time
        self._data = threading.Lock()  # the figures, read while a follow adds to them
        self._counts: Counter[tuple[str, str]] = Counter()
        self._latest: deque[Letter] = deque(maxlen=self.KEEP)
        self._read_at: float | None = None  # monotonic time the topic's end was last reached

    def follow(self, timeout: float = 10.0) -> None:
        """Read what was added since the last follow (Kafka away: raises, the figures stay)."""
        with self._reading:
            if self._consumer is None:
                self._consumer, _ = replaying_consumer(self._settings.kafka_bootstrap_servers, [self._tp])
            read_to_end(self._consumer, self._tp, self._keep, timeout)
            self._read_at = time.monotonic()

    def _keep(self, record: Any) -> None:
        found = letter_of(record)
        if found is None:
            return
        with self._data:
            self._counts[(found.letter.stage, found.letter.kind)] += 1
            self._latest.append(found)

    def snapshot(self) -> tuple[dict[tuple[str, str], int], list[Letter], float | None]:
        """Counts, the newest letters (newest first) and seconds since the topic's end was reached
        (None: never)."""
        with self._data:
            age = None if self._read_at is None else time.monotonic() - self._read_at
            return dict(self._counts), list(reversed(self._latest)), age

    def close(self) -> None:
        with self._reading:
            if self._consumer is not None:
                self._consumer.close(autocommit=False)
                self._consumer = None
