"""GPU samples as the ledger keeps them (domain/gpu_utilisation.py) and as the meter holds them
until their job's submission (JobMeter.hold_samples)."""

from __future__ import annotations

import orjson
import pytest

from allmende.domain.gpu_utilisation import (
    LOW_CAP_BP,
    UnaccountedRow,
    UtilisationRow,
    decode_rows,
    encode_rows,
    job_pieces,
    mean_bp,
    row_of,
    unaccounted_of,
)
from allmende.domain.metering import PENDING_SAMPLES_MAX, JobMeter
from allmende.domain.squatting import JobTotals, SquatRule, find_squatting
from allmende.schemas.events import JobSubmitted
from allmende.schemas.gpu_samples import GpuSample, GpuSamples, sample_id
from allmende.services.dashboard_queries import merged_runs

T0 = 1_800_000_000


def _record(job: str | None, at: int, bps: list[int], node: str = "n1", interval: int = 30) -> GpuSamples:
    return GpuSamples(
        event_id=sample_id(node, at, job), occurred_at=at, producer="t", node=node, job_id=job,
        interval_s=interval, gpus=tuple(GpuSample(gpu=i, utilization_bp=bp) for i, bp in enumerate(bps)),
    )  # fmt: skip


def test_a_record_under_the_cap_is_one_row_over_its_scrape_period_and_a_busy_one_none() -> None:
    idle = row_of(_record("j", T0, [0, 100, 200, 101]))
    assert idle == UtilisationRow("", "", "", "j", "n1", T0 - 30, T0, 4, 100)  # mean rounded down
    assert mean_bp(_record("j", T0, [LOW_CAP_BP] * 8)) == LOW_CAP_BP
    assert row_of(_record("j", T0, [LOW_CAP_BP] * 8)) is None  # at the cap: busy
    assert row_of(_record(None, T0, [0] * 8)) is None  # free GPUs: nobody's
    # GPUs with no job: those busy (above 0, as the collector counts them) are unaccounted use
    assert unaccounted_of(_record(None, T0, [0, 0, 3_000, 5_001])) == UnaccountedRow(
        "n1", T0 - 30, T0, 2, 4_000
    )
    assert unaccounted_of(_record(None, T0, [0] * 8)) is None
    assert unaccounted_of(_record("j", T0, [9_000] * 8)) is None  # a job's GPUs are its own


def test_rows_round_trip_and_a_bad_row_is_refused_with_why() -> None:
    row = UtilisationRow("p", "u", "c", "j", "n1", 970, 1000, 4, 100)
    other = UnaccountedRow("n2", 970, 1000, 2, 4_000)
    assert decode_rows(orjson.loads(orjson.dumps(encode_rows([row])))) == ([row], [])
    assert decode_rows(orjson.loads(orjson.dumps(encode_rows([], [other])))) == ([], [other])
    for bad, why in [
        ({"utilisation": [["p", "u", "c", "j", "n1", 970, 1000, 4]]}, "not a utilisation row"),
        ({"utilisation": [["p", "u", "c", "j", "n1", 970, 1000, 4, "100"]]}, "not a utilisation row"),
        ({"utilisation": [["p", "u", "c", "j", "n1", 1000, 1000, 4, 100]]}, "out of range"),
        ({"utilisation": [["p", "u", "c", "j", "n1", 970, 1000, 4, LOW_CAP_BP]]}, "out of range"),
        ({"utilisation": [], "unaccounted": [["n2", 970, 1000, 2, 0]]}, "unaccounted-use row out of range"),
        ({"utilisation": [], "unaccounted": [["n2", 970, 1000, 2]]}, "not an unaccounted-use row"),
        ({"utilisation": [], "unaccounted": {}}, "a utilisation record is"),
        ({"rows": []}, "a utilisation record is"),
        ([1, 2], "a utilisation record is"),
    ]:
        with pytest.raises(ValueError, match=why):
            decode_rows(bad)


def test_a_multi_node_jobs_periods_weigh_its_nodes_gpus_and_charge_at_its_mean_rate() -> None:
    rows = [(0, 30, 8, 0), (0, 30, 4, 300), (30, 60, 8, 60)]  # two nodes, then one (the other busy)
    totals = JobTotals(gpu_seconds=12 * 60, charge_units=7_200, last_end=60)  # 10 units per GPU-second
    assert job_pieces(rows, totals) == [
        (0, 30, 12, 100, 3_600),  # (8 x 0 + 4 x 300) / 12; 12 GPUs x 30 s x 10
        (30, 60, 8, 60, 2_400),
    ]
    assert [p.charge_units for p in job_pieces(rows, JobTotals(0, 0, 0))] == [0, 0]  # nothing charged yet


def test_measured_pieces_judged_as_squatting_after_the_grace_period_alone() -> None:
    rule = SquatRule(max_utilization_bp=500, grace_s=1800)
    idle = [(30 * k, 30 * (k + 1), 4, 100) for k in range(61)]  # 30.5 minutes
    totals = JobTotals(0, 0, 0)
    runs = merged_runs(job_pieces(idle, totals), rule.max_utilization_bp)
    assert len(runs) == 1 and (runs[0].start, runs[0].end) == (0, 1830)
    found = find_squatting("j", runs, rule, totals)
    assert found is not None and (found.idle_since, found.idle_gpu_seconds) == (0, 4 * 1830)
    assert find_squatting("j", job_pieces(idle[:60], totals), rule, totals) is None  # 30 minutes: not yet
    gap = idle[:30] + idle[31:]  # a period missing (busy, or a node not read) breaks the stretch
    assert find_squatting("j", job_pieces(gap, totals), rule, totals) is None


def _submitted(job: str) -> JobSubmitted:
    return JobSubmitted(
        event_id=f"{job}:sub", occurred_at=T0, producer="t", job_id=job, project="p", user="u",
        cluster="c", gpu_type="H100", gpus=8, priority_class="standard", requested_seconds=3600,
    )  # type: ignore[arg-type]  # fmt: skip


def test_the_meter_holds_a_jobs_rows_until_its_submission_bounded_and_once_each() -> None:
    meter = JobMeter("j")
    assert meter.attribution() is None
    rows = [list(UtilisationRow("", "", "", "j", "n1", 30 * k, 30 * (k + 1), 8, 0)) for k in range(10)]
    assert meter.hold_samples(rows) == [] and meter.hold_samples(rows[:3]) == []  # duplicates once
    assert len(meter.pending_samples) == 10
    assert meter.last_instant() == 300  # a job known only by samples goes after a retention
    again = JobMeter.from_bytes(meter.to_bytes())
    assert again.pending_samples == meter.pending_samples
    many = [
        list(UtilisationRow("", "", "", "j", "n2", 30 * k, 30 * (k + 1), 8, 0))
        for k in range(PENDING_SAMPLES_MAX)
    ]
    given_way = again.hold_samples(many)
    assert len(again.pending_samples) == PENDING_SAMPLES_MAX and len(given_way) == 10
    assert min(r[6] for r in given_way) == 30 and max(r[6] for r in given_way) == 150  # the oldest
    again.apply(_submitted("j"))
    assert again.attribution() == ("p", "u", "c") and again.last_instant() is None
