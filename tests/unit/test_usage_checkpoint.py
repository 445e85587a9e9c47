"""A fair-share usage checkpoint: restored and fed the rest of the stream, it is the ledger that
was fed all of it (same integers, same folded figures, same decayed bits)."""

from __future__ import annotations

import random

import orjson
import pytest

from allmende.domain.fairshare.usage import UsageLedger, decayed_usage
from tests.unit.test_fairshare_folding import FLAT, HL, HOUR, START, K, entry


def _stream(seed: int, n: int = 300) -> list[tuple[str, object]]:
    """Entries (revisions, other projects and clusters), retirements and folds, in random order."""
    rng = random.Random(seed)
    ops: list[tuple[str, object]] = []
    for i in range(n):
        roll = rng.random()
        if roll < 0.08 and i > 10:
            ops.append(("retire", f"job-e{rng.randrange(i)}"))
        elif roll < 0.15:
            ops.append(("fold", None))
        else:
            eid = f"e{rng.randrange(max(1, i))}" if rng.random() < 0.3 else f"e{i}"
            start = START + rng.randrange(0, 60 * HOUR)
            end = start + rng.randrange(1, 4 * HOUR)
            project = rng.choice(("olmo", "pythia", "tulu"))
            e = entry(eid, start, end, rng.choice((1, 2, 8)), version=rng.randrange(1, 4), project=project)
            ops.append(("apply", e))
    return ops


def _feed(ledger: UsageLedger, ops: list[tuple[str, object]]) -> None:
    for kind, arg in ops:
        if kind == "apply":
            ledger.apply(arg, FLAT)  # type: ignore[arg-type]
        elif kind == "retire":
            ledger.retire(arg)  # type: ignore[arg-type]
        else:
            ledger.fold(HL, half_lives=K)


def _same(a: UsageLedger, b: UsageLedger) -> None:
    assert a.dump() == b.dump()
    assert (a.jobs, a.clock, a.project_hours()) == (b.jobs, b.clock, b.project_hours())
    assert {k: sorted(v) for k, v in a._of_job.items()} == {k: sorted(v) for k, v in b._of_job.items()}
    assert (a._per_hour, a._folded, a._dropped) == (b._per_hour, b._folded, b._dropped)
    at = max(a.clock, START)
    assert decayed_usage(a.project_hours(), at, HL, fold_half_lives=K) == decayed_usage(
        b.project_hours(), at, HL, fold_half_lives=K
    )


@pytest.mark.parametrize("seed", range(12))
def test_a_checkpoint_taken_anywhere_and_the_rest_of_the_stream_give_the_ledger_of_the_whole_stream(
    seed: int,
) -> None:
    ops = _stream(seed)
    cut = random.Random(seed).randrange(len(ops))
    whole = UsageLedger()
    _feed(whole, ops)

    before = UsageLedger()
    _feed(before, ops[:cut])
    stored = orjson.dumps(before.dump())  # what the checkpoint file holds
    restored = UsageLedger.restore(orjson.loads(stored))
    _same(restored, before)
    assert restored.generation != before.generation  # caches keyed on the old ledger are stale
    _feed(restored, ops[cut:])
    _same(restored, whole)


def test_a_checkpoint_with_a_float_where_integers_belong_is_refused() -> None:
    ledger = UsageLedger()
    ledger.apply(entry("e1", START, START + 600, 2), FLAT)
    data = ledger.dump()
    data["hours"]["olmo"][0][3] = 1.5
    with pytest.raises(ValueError, match="integers"):
        UsageLedger.restore(data)
