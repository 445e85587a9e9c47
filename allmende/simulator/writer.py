"""`python -m allmende.simulator.writer RUN_DIR`: a simulated run's ledger writer, in a process
of its own, and the run's ledger check.

The engine's thread and a ledger writer in one process share one interpreter lock: on the whole
Philly cut that cost the simulation about half its speed. So the run's writer runs here, on the
run's own database (a chDB directory may be owned by one process only: the run's, under its work
directory), and answers the one question the simulator has once every event is in Kafka: does
the ledger hold, job by job, the GPU-seconds the engine ran, and what did it charge per project?

Files in RUN_DIR: `settings.json` (read at start), `ready` (written once the writer runs),
`expected.json` (written by the simulator when the run's events are all in Kafka: GPU-seconds per
job, the projects, a timeout), `check.json` (written here, then the process ends).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from allmende.core.clickhouse import Database
from allmende.core.ledger_store import LedgerStore
from allmende.core.settings import Settings
from allmende.streams.ledger_writer import LedgerWriter

PARENT_GONE_S = 24 * 3600  # a writer nobody asks stops after this long


@dataclass
class LedgerCheck:
    """The ledger against the simulation, job by job."""

    jobs: int
    gpu_seconds: int  # what the simulation ran, in total
    ledger_gpu_seconds: int
    mismatched: dict[str, tuple[int, int]] = field(default_factory=dict)  # job -> (simulated, ledger)

    @property
    def exact(self) -> bool:
        return not self.mismatched and self.gpu_seconds == self.ledger_gpu_seconds


def check_ledger(store: LedgerStore, expected: Mapping[str, int]) -> LedgerCheck:
    ledger = store.job_gpu_seconds()
    wanted = {job: seconds for job, seconds in expected.items() if seconds}
    mismatched = {
        job: (seconds, ledger.get(job, 0)) for job, seconds in wanted.items() if ledger.get(job, 0) != seconds
    }
    mismatched.update({job: (0, seconds) for job, seconds in ledger.items() if job not in wanted and seconds})
    return LedgerCheck(len(wanted), sum(wanted.values()), sum(ledger.values()), mismatched)


def wait_for_ledger(
    store: LedgerStore, expected: Mapping[str, int], timeout_s: float, settle_s: float = 60.0
) -> LedgerCheck:
    """Until the ledger holds the simulation's GPU-seconds (in total, then job by job), or it has
    not moved for `settle_s` (a ledger that disagrees is reported, not waited on until timeout)."""
    total = sum(expected.values())
    deadline = time.monotonic() + timeout_s
    last, moved = -1, time.monotonic()
    while (now := store.total_gpu_seconds()) != total and time.monotonic() < deadline:
        if now != last:
            last, moved = now, time.monotonic()
        elif time.monotonic() - moved > settle_s:
            break
        time.sleep(0.2)
    return check_ledger(store, expected)


def project_charges(store: LedgerStore, projects: Sequence[str]) -> dict[str, int]:
    """Charge units the ledger holds per project (every entry, whatever its end)."""
    return {p: store.project_charges(p, 2**62)[0] for p in projects}


def main(run_dir: Path) -> None:
    settings = Settings.model_validate_json((run_dir / "settings.json").read_text())
    db = Database(settings.clickhouse_dsn, settings.clickhouse_database)
    db.migrate()
    store = LedgerStore(db, sole_writer=True)
    writer = LedgerWriter(settings, store)
    writer.start()
    (run_dir / "ready").touch()
    try:
        expected_file, waited = run_dir / "expected.json", time.monotonic()
        while not expected_file.exists():
            if time.monotonic() - waited > PARENT_GONE_S:
                return
            time.sleep(0.05)
        asked = json.loads(expected_file.read_text())
        check = wait_for_ledger(store, asked["gpu_seconds"], asked["timeout_s"])
        answer = {
            "jobs": check.jobs,
            "gpu_seconds": check.gpu_seconds,
            "ledger_gpu_seconds": check.ledger_gpu_seconds,
            "mismatched": check.mismatched,
            "charges": project_charges(store, asked["projects"]),
        }
        partial = run_dir / "check.json.part"
        partial.write_text(json.dumps(answer))
        partial.rename(run_dir / "check.json")  # whole or absent: the simulator polls for it
    finally:
        writer.stop()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
