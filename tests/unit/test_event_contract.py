"""The job-event contract: what parse_job_event accepts, and why it rejects the rest."""

from __future__ import annotations

import orjson
import pytest

from allmende.schemas.events import (
    JOB_EVENT_TYPES,
    ContractError,
    JobFinished,
    JobPreempted,
    JobStarted,
    JobSubmitted,
    JobUsageSample,
    encode_event,
    parse_job_event,
)
from tests.unit.builders import T0, finished, preempted, sample, started, submitted


def _started_json(**changes: object) -> bytes:
    fields: dict[str, object] = {
        "event_id": "e-1", "type": "JobStarted", "schema_version": 1, "occurred_at": T0,
        "producer": "scheduler", "job_id": "job-1", "gpus": 4,
    }  # fmt: skip
    fields.update(changes)
    return orjson.dumps({k: v for k, v in fields.items() if v is not _DROP})


_DROP = object()


def _sample_json(**changes: object) -> bytes:
    fields: dict[str, object] = {
        "event_id": "e-2", "type": "JobUsageSample", "occurred_at": T0, "producer": "meter",
        "job_id": "job-1", "gpus_in_use": 2, "gpu_utilization": 0.5,
    }  # fmt: skip
    fields.update(changes)
    return orjson.dumps(fields)


# (case, raw bytes, words the reason must contain)
REJECTED = [
    ("bytes that are not JSON are rejected as invalid JSON", b'{"event_id": "e-1",', ["Invalid JSON"]),
    ("a JSON array instead of an object is rejected", b"[1, 2]", ["object"]),
    ("an event without a type cannot be dispatched", orjson.dumps({"event_id": "e-1"}), ["type"]),
    (
        "an unknown type is rejected and the known types are listed",
        _started_json(type="JobExploded"),
        ["JobExploded", "JobSubmitted", "JobFinished"],
    ),
    ("a missing envelope field is named", _started_json(occurred_at=_DROP), ["occurred_at", "required"]),
    ("a missing field of the event type is named", _started_json(gpus=_DROP), ["gpus", "required"]),
    (
        "several missing fields are all named",
        orjson.dumps({"type": "JobStarted", "event_id": "e-1"}),
        ["occurred_at", "producer", "job_id", "gpus"],
    ),
    ("negative GPUs on a start are rejected", _started_json(gpus=-1), ["gpus", "greater than or equal"]),
    ("zero GPUs on a start are rejected", _started_json(gpus=0), ["gpus"]),
    ("negative GPUs in use on a sample are rejected", _sample_json(gpus_in_use=-3), ["gpus_in_use"]),
    ("an extra field is rejected by name", _started_json(colour="blue"), ["colour", "Extra"]),
    (
        "a float occurred_at is rejected even when whole",
        _started_json(occurred_at=float(T0)),
        ["occurred_at", "integer"],
    ),
    ("a fractional GPU count is rejected", _started_json(gpus=2.5), ["gpus", "integer"]),
    ("a numeric string where an int is required is rejected", _started_json(gpus="4"), ["gpus"]),
    ("a utilisation above one is rejected", _sample_json(gpu_utilization=1.01), ["gpu_utilization"]),
    ("a negative utilisation is rejected", _sample_json(gpu_utilization=-0.1), ["gpu_utilization"]),
    ("an occurred_at before 2001 is rejected", _started_json(occurred_at=999_999_999), ["occurred_at"]),
    ("an unknown schema version is rejected", _started_json(schema_version=2), ["schema_version"]),
    ("an identifier with a space is rejected", _started_json(job_id="job 1"), ["job_id"]),
    ("an empty identifier is rejected", _started_json(event_id=""), ["event_id"]),
]


@pytest.mark.parametrize(("raw", "must_mention"), [c[1:] for c in REJECTED], ids=[c[0] for c in REJECTED])
def test_invalid_event_raises_contract_error_with_readable_reason(
    raw: bytes, must_mention: list[str]
) -> None:
    with pytest.raises(ContractError) as caught:
        parse_job_event(raw)
    reason = caught.value.reason
    assert reason == str(caught.value)
    assert reason.startswith("contract violation: ")
    assert "\n" not in reason
    for word in must_mention:
        assert word in reason, f"{word!r} missing from {reason!r}"


def test_contract_error_is_a_value_error_so_callers_can_catch_it_generically() -> None:
    with pytest.raises(ValueError):
        parse_job_event(b"nope")


def test_the_boundaries_of_the_utilisation_range_are_accepted() -> None:
    for utilization in (0.0, 1.0):
        event = parse_job_event(_sample_json(gpu_utilization=utilization))
        assert isinstance(event, JobUsageSample)
        assert event.gpu_utilization == utilization


def test_a_valid_event_without_schema_version_gets_the_current_one() -> None:
    event = parse_job_event(_started_json(schema_version=_DROP))
    assert isinstance(event, JobStarted)
    assert event.schema_version == 1


ROUND_TRIPS = [
    ("a submission round-trips", submitted(gpus=8, interactive=True), JobSubmitted),
    (
        "a start with hosts round-trips",
        JobStarted(event_id="s-1", occurred_at=T0, producer="p", job_id="job-1", gpus=2, hosts=("h1", "h2")),
        JobStarted,
    ),
    ("a start without hosts round-trips", started(0, 3, "s-2"), JobStarted),
    ("a usage sample round-trips", sample(60, 0, "u-1", utilization=0.25), JobUsageSample),
    ("a preemption without started_at round-trips", preempted(100, "p-1"), JobPreempted),
    ("a preemption with started_at round-trips", preempted(100, "p-2", started_at=5), JobPreempted),
    ("a finish with started_at round-trips", finished(200, "f-1", started_at=0), JobFinished),
]


@pytest.mark.parametrize(("event", "kind"), [c[1:] for c in ROUND_TRIPS], ids=[c[0] for c in ROUND_TRIPS])
def test_encoded_event_parses_back_to_an_equal_event(event: object, kind: type) -> None:
    raw = encode_event(event)  # type: ignore[arg-type]
    back = parse_job_event(raw)
    assert type(back) is kind
    assert back == event
    assert encode_event(back) == raw


def test_every_event_type_is_covered_by_a_round_trip_case() -> None:
    assert {kind for *_, kind in ROUND_TRIPS} == set(JOB_EVENT_TYPES)


def test_encoded_events_are_flat_objects_with_a_stable_type_name() -> None:
    for _, event, kind in ROUND_TRIPS:
        decoded = orjson.loads(encode_event(event))
        assert decoded["type"] == kind.__name__
        assert all(not isinstance(v, dict) for v in decoded.values())
