"""Fair share lets go of a retired job's entries and keeps its units."""

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


def test_a_retired_jobs_entries_go_and_its_units_stay(tmp_path: Path) -> None:
    fs = _calculator(tmp_path)
    old = [_entry("old", 1, T, T + 600), _entry("old", 2, T + 600, T + 1200)]
    fs.take([encode_entries(old)])
    units = fs.usage.charge_units("p")
    assert units == fs.usage.jobs["old"] > 0 and "old-1" in fs.usage.entries

    fs.take([encode_retired("old", T + 1200 + R)])
    assert fs.usage.charge_units("p") == units
    assert not fs.usage.holds_job("old") and "old-1" not in fs.usage.entries and "old" not in fs.usage.jobs

    # A job still held counts a late entry as ever.
    live = _entry("live", 1, T, T + 300)
    fs.take([encode_entries([live])])
    first = fs.usage.jobs["live"]
    fs.take([encode_entries([_entry("live", 0, T - 300, T)])])
    assert fs.usage.jobs["live"] == 2 * first


def test_entries_and_their_retirement_in_one_batch(tmp_path: Path) -> None:
    fs = _calculator(tmp_path)
    entry = _entry("j", 1, T, T + 60)
    fs.take([encode_entries([entry]), encode_retired("j", T + 60 + R)])
    assert fs.usage.charge_units("p") > 0 and not fs.usage.holds_job("j")
