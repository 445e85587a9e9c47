"""GPU samples as the ledger keeps them (domain/gpu_utilisation.py), the payloads beside ledger
entries (attributions; earlier meters' attributed rows), and whose a job is (JobMeter.attribution)."""

from __future__ import annotations

import orjson
import pytest

from allmende.domain.gpu_utilisation import (
    LOW_CAP_BP,
    IdleRow,
    JobAttribution,
    UnaccountedRow,
    decode_payload,
    encode_attributions,
    encode_rows,
    job_pieces,
    mean_bp,
    row_of,
    unaccounted_of,
)
from allmende.domain.metering import JobMeter
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
    assert idle == IdleRow("j", "n1", T0 - 30, T0, 4, 100)  # mean rounded down
    assert mean_bp(_record("j", T0, [LOW_CAP_BP] * 8)) == LOW_CAP_BP
    assert row_of(_record("j", T0, [LOW_CAP_BP] * 8)) is None  # at the cap: busy
    assert row_of(_record(None, T0, [0] * 8)) is None  # free GPUs: nobody's
    # GPUs with no job: those busy (above 0, as the collector counts them) are unaccounted use
    assert unaccounted_of(_record(None, T0, [0, 0, 3_000, 5_001])) == UnaccountedRow(
        "n1", T0 - 30, T0, 2, 4_000
    )
    assert unaccounted_of(_record(None, T0, [0] * 8)) is None
    assert unaccounted_of(_record("j", T0, [9_000] * 8)) is None  # a job's GPUs are its own


def _decoded(payload: dict[str, object]) -> tuple[list[IdleRow], list[JobAttribution], list[UnaccountedRow]]:
    found = decode_payload(orjson.loads(orjson.dumps(payload)))
    return found.idle, found.attributions, found.unaccounted


def test_payloads_round_trip_earlier_rows_split_and_a_bad_one_is_refused_with_why() -> None:
    owner = JobAttribution("j", "p", "u", "c")
    assert _decoded(encode_attributions([owner])) == ([], [owner], [])
    # An earlier meter's attributed row (a replay of the ledger-entry topic meets them): its
    # sample and whose it is, as they are kept now.
    row = ["p", "u", "c", "j", "n1", 970, 1000, 4, 100]
    assert _decoded(encode_rows([row])) == ([IdleRow("j", "n1", 970, 1000, 4, 100)], [owner], [])
    other = UnaccountedRow("n2", 970, 1000, 2, 4_000)
    assert _decoded(encode_rows([], [other])) == ([], [], [other])
    for bad, why in [
        ({"utilisation": [["p", "u", "c", "j", "n1", 970, 1000, 4]]}, "not a utilisation row"),
        ({"utilisation": [["p", "u", "c", "j", "n1", 970, 1000, 4, "100"]]}, "not a utilisation row"),
        ({"utilisation": [["p", "u", "c", "j", "n1", 1000, 1000, 4, 100]]}, "out of range"),
        ({"utilisation": [["p", "u", "c", "j", "n1", 970, 1000, 4, LOW_CAP_BP]]}, "out of range"),
        ({"utilisation": [], "unaccounted": [["n2", 970, 1000, 2, 0]]}, "unaccounted-use row out of range"),
        ({"utilisation": [], "unaccounted": [["n2", 970, 1000, 2]]}, "not an unaccounted-use row"),
        ({"utilisation": [], "unaccounted": {}}, "rows and attributions are JSON arrays"),
        ({"attribution": [["j", "p", "u"]]}, "not a job attribution"),
        ({"attribution": [["", "p", "u", "c"]]}, "not a job attribution"),  # no job
        ({"rows": []}, "an object on the ledger-entry topic is"),
        ({}, "an object on the ledger-entry topic is"),
        ([1, 2], "an object on the ledger-entry topic is"),
    ]:
        with pytest.raises(ValueError, match=why):
            decode_payload(bad)


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


def test_a_job_is_attributed_by_its_submission_and_a_state_of_samples_alone_goes_at_once() -> None:
    meter = JobMeter("j")
    assert meter.attribution() is None
    meter.apply(_submitted("j"))
    assert meter.attribution() == ("p", "u", "c") and meter.last_instant() is None  # waiting: kept
    # State an earlier meter kept for samples alone, before the job's submission: nothing to meter.
    legacy = JobMeter.from_bytes(
        orjson.dumps({"j": "k", "s": None, "b": [], "p": [["", "", "", "k", "n1", 0, 30, 8, 0]]})
    )
    assert legacy.attribution() is None and legacy.last_instant() == 0
    assert b'"p"' not in legacy.to_bytes()
