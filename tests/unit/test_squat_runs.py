"""The dashboards merge each job's consecutive low pieces into runs before judging squatting:
the merge must not change a verdict, a cost or a total."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from allmende.domain.squatting import JobTotals, SquatRule, find_squatting
from allmende.services.dashboard_queries import contiguous_runs
from tests.unit.test_squatting import job, runs

RULE = SquatRule()


@settings(max_examples=300, deadline=None, database=None)
@given(st.lists(runs, min_size=1, max_size=4), st.randoms(use_true_random=False))
def test_runs_give_the_verdicts_of_the_pieces(
    specs: list[list[tuple[int, int, int, int]]], rng: random.Random
) -> None:
    by_job = {f"job-{i}": [p for p in job(spec) if p.gpus > 0] for i, spec in enumerate(specs)}
    rows = [(j, p) for j, pieces in by_job.items() for p in pieces]
    rng.shuffle(rows)  # the ledger returns them in any order
    merged = contiguous_runs(
        [j for j, _ in rows],
        [p.start for _, p in rows],
        [p.end for _, p in rows],
        [p.gpus * (p.end - p.start) for _, p in rows],
        [p.utilization_bp for _, p in rows],
        [p.charge_units for _, p in rows],
        RULE.max_utilization_bp,
    )
    for name, pieces in by_job.items():
        if not pieces:
            assert name not in merged
            continue
        totals = JobTotals(
            sum(p.gpus * (p.end - p.start) for p in pieces), sum(p.charge_units for p in pieces),
            max(p.end for p in pieces),
        )  # fmt: skip
        assert find_squatting(name, merged[name], RULE, totals) == find_squatting(name, pieces, RULE)
        assert len(merged[name]) <= len(pieces)
        assert sum(p.charge_units for p in merged[name]) == totals.charge_units


def test_a_long_idle_job_becomes_one_run() -> None:
    pieces = job([(0, 10, 100, 4)] * 100)  # 100 contiguous idle pieces
    merged = contiguous_runs(
        ["j"] * 100, [p.start for p in pieces], [p.end for p in pieces],
        [p.gpus * (p.end - p.start) for p in pieces], [100] * 100, [p.charge_units for p in pieces], 500,
    )  # fmt: skip
    assert len(merged["j"]) == 1
    (run,) = merged["j"]
    assert (run.start, run.end, run.gpus) == (pieces[0].start, pieces[-1].end, 4)
