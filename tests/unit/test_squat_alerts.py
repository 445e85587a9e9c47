"""Squatting alerts: once per idle stretch, to the job's user and its project's leads, with its
GPUs, since when it idles and what it has cost; a restarted alerter (the fold of the alerts log)
sends none again; a job that works again and idles again is told again."""

from __future__ import annotations

from allmende.domain.burn_alerts import fold
from allmende.domain.charging import CHARGE_UNITS_PER_GPU_SECOND
from allmende.domain.squat_alerts import SquatFound, keep_ongoing, latest_gpus, squat_alerts
from allmende.domain.squatting import SquatRule, UsagePiece, find_squatting
from allmende.services.burn_alerts import slack_body

MIN = 60
T0 = 1_800_000_000
RULE = SquatRule()  # under 500 bp for longer than 30 minutes
IDLE, BUSY = 100, 9000


def piece(start_min: int, end_min: int, bp: int, gpus: int = 4) -> UsagePiece:
    start, end = T0 + start_min * MIN, T0 + end_min * MIN
    return UsagePiece(start, end, gpus, bp, CHARGE_UNITS_PER_GPU_SECOND * gpus * (end - start))


def found(job: str, pieces: list[UsagePiece]) -> SquatFound:
    squat = find_squatting(job, pieces, RULE)
    assert squat is not None
    return SquatFound("vision", "ada", "h100-a", ("bob", "cleo"), latest_gpus(pieces), squat)


def test_a_job_idle_past_the_grace_is_flagged_once_with_its_people_and_cost() -> None:
    parked = found("parked", [piece(0, 10, BUSY), piece(10, 40, IDLE), piece(40, 50, IDLE, gpus=8)])
    (event,) = squat_alerts([parked], set(), now=T0 + 60 * MIN, as_of=T0 + 50 * MIN)
    assert (event.job_id, event.user, event.leads, event.gpus) == ("parked", "ada", ["bob", "cleo"], 8)
    assert event.idle_since == T0 + 10 * MIN and event.event_id == f"squat/parked/{T0 + 10 * MIN}"
    assert event.idle_gpu_seconds == 4 * 30 * MIN + 8 * 10 * MIN
    assert event.gpu_seconds == 4 * 40 * MIN + 8 * 10 * MIN
    assert event.charge_units == CHARGE_UNITS_PER_GPU_SECOND * event.gpu_seconds
    assert "Job parked of ada (project vision" in event.message and "Leads: bob, cleo" in event.message
    assert "idle since 2027-01-15 08:10 UTC" in event.message and "8 GPUs" in event.message
    # 200 idle GPU-minutes of 240: 3.3 of 4 GPU-hours, charged at weight 1
    assert ": 3.3 idle GPU-hours; the job has used 4 GPU-hours, charged 4 weighted" in event.message
    body = slack_body(event)
    assert body["text"] == event.message and "`parked`" in body["blocks"][1]["elements"][0]["text"]

    state = fold([event])  # the alerts log, replayed by a restarted alerter
    assert squat_alerts([parked], state.squats, now=T0 + 61 * MIN, as_of=T0 + 50 * MIN) == []


def test_a_job_not_idle_now_or_not_long_enough_is_not_flagged() -> None:
    recovered = found("dip", [piece(0, 40, IDLE), piece(40, 50, BUSY)])
    assert not recovered.squatting.ongoing
    short = find_squatting("short", [piece(0, 20, BUSY), piece(20, 45, IDLE)], RULE)
    assert short is None  # 25 minutes idle: inside the grace
    assert squat_alerts([recovered], set(), now=T0, as_of=T0) == []


def test_a_new_idle_stretch_is_a_new_alert_and_ended_stretches_are_forgotten() -> None:
    first = found("j", [piece(0, 40, IDLE)])
    (one,) = squat_alerts([first], set(), now=T0, as_of=T0)
    state = fold([one])
    again = found("j", [piece(0, 40, IDLE), piece(40, 50, BUSY), piece(50, 90, IDLE)])
    keep_ongoing(state.squats, [again])
    assert state.squats == set()  # the first stretch ended: nothing of it is kept
    (two,) = squat_alerts([again], state.squats, now=T0, as_of=T0)
    assert two.idle_since == T0 + 50 * MIN and two.event_id != one.event_id
