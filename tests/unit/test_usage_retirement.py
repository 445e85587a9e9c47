"""Fair share lets go of a retired job's entries, keeps its units, and never counts a copy twice."""

from __future__ import annotations

from pathlib import Path

from allmende.core.settings import Settings
from allmende.schemas.ledger import LedgerEntry, encode_entries, encode_retired, new_entry
from allmende.streams.admin_log import AdminLog
from allmende.streams.fairshare_calculator import FairShareCalculator

R = 3600
T = 1_790_000_000


def _entry(job: str, n: int, start: int, end: int, version: int = 1) -> LedgerEntry:
    return new_entry(
        entry_id=f"{job}-{n}", job_id=job, version=version, interval_start=start, interval_end=end,
        gpus=2, project="p", user="u", cluster="c1", gpu_type="H100", priority_class="standard",
        interactive=False, source_event_id=f"{job}-{n}-{version}", pred_event_id="", utilization_bp=10_000,
    )  # fmt: skip


def _calculator(tmp_path: Path) -> FairShareCalculator:
    settings = Settings(ended_job_retention_s=R, meter_data_dir=tmp_path, topic_prefix="unit")
    return FairShareCalculator(settings, AdminLog(settings))


def test_a_retired_jobs_entries_go_its_units_stay_and_a_copy_counts_once(tmp_path: Path) -> None:
    fs = _calculator(tmp_path)
    old = [_entry("old", 1, T, T + 600), _entry("old", 2, T + 600, T + 1200)]
    fs.take([encode_entries(old)], [0])
    units = fs.usage.charge_units("p")
    assert units == fs.usage.jobs["old"] > 0 and "old-1" in fs.usage.entries

    fs.take([encode_retired("old", T + 1200 + R)], [0])
    assert fs.usage.charge_units("p") == units
    assert not fs.usage.holds_job("old") and "old-1" not in fs.usage.entries and "old" not in fs.usage.jobs

    # The topic replayed onto itself: the copy ends by the horizon and its job is not held.
    fs.take([encode_entries(old)], [0])
    assert fs.usage.charge_units("p") == units and not fs.usage.holds_job("old")

    # On another partition there is no horizon yet; and a job still held counts its late entry.
    live = _entry("live", 1, T, T + 300)
    fs.take([encode_entries([live])], [1])
    first = fs.usage.jobs["live"]
    fs.take([encode_entries([_entry("live", 0, T - 300, T)])], [0])  # partition 0: past its horizon
    assert fs.usage.jobs["live"] == 2 * first
    fresh = _entry("fresh", 1, T + 1200 + R, T + 1300 + R)  # ends after the horizon: a new job's
    fs.take([encode_entries([fresh])], [0])
    assert fs.usage.holds_job("fresh")
    assert fs.usage.charge_units("p") > units


def test_entries_and_their_retirement_in_one_batch(tmp_path: Path) -> None:
    fs = _calculator(tmp_path)
    entry = _entry("j", 1, T, T + 60)
    fs.take([encode_entries([entry]), encode_retired("j", T + 60 + R)], [0, 0])
    assert fs.usage.charge_units("p") > 0 and not fs.usage.holds_job("j")
