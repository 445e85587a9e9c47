"""Fair share restarts from a checkpoint: it loads the usage with the offsets it covers, reads only
the tail of the ledger stream, and ends with the very figures a full replay gives; a checkpoint
that cannot be trusted (altered, or ahead of the topic) is ignored and the stream replayed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from allmende.core.settings import Settings
from allmende.streams.fairshare_calculator import CHECKPOINT_KIND
from allmende.testing.budget_harness import ADMIN, ok, plan_text, running_api
from allmende.testing.harness import wait_until
from tests.integration.test_budgets import NOW, QUARTER_PLAN, _meter_all, _run
from tests.integration.test_fairshare_stream import _settled

pytestmark = pytest.mark.integration


def _restarted(s: Settings, as_of: int) -> tuple[dict[str, Any], dict[str, Any], dict[int, int] | None]:
    """Start the API again: its published tree, its usage's dump, the offsets it resumed from."""
    with running_api(s, NOW) as (api, _):
        body = _settled(api, as_of)
        calculator = api.app.state.fairshare  # type: ignore[attr-defined]
        return body, calculator.usage.dump(), calculator.resumed_from


def test_a_restart_reads_only_the_tail_after_its_checkpoint_and_agrees_with_a_full_replay(
    settings: Settings, tmp_path: Path
) -> None:
    s = settings.model_copy(update={"fairshare_publish_s": 0.2, "checkpoint_every_s": 0.2})
    first = _run("job-a", "olmo-ft", start=NOW - 7200, end=NOW - 3600, gpus=4)
    later = _run("job-b", "vision", start=NOW - 3600, end=NOW, gpus=8)
    with running_api(s, NOW) as (api, _):
        ok(api.post("/v1/admin/plan/apply", json={"text": plan_text(QUARTER_PLAN)}, headers=ADMIN))
        _meter_all(s, first, tmp_path / "logs", api.app.state.store)  # type: ignore[attr-defined]
        _settled(api, NOW - 3600)
        calculator = api.app.state.fairshare  # type: ignore[attr-defined]
        checkpoint = calculator.checkpoints.path(CHECKPOINT_KIND)

        def covers_all() -> dict[int, int] | None:
            if not checkpoint.exists():
                return None
            header = orjson.loads(checkpoint.read_bytes().split(b"\n", 1)[0])
            offsets = {int(p): o for p, o in header["offsets"][s.ledger_entries_topic].items()}
            return offsets if offsets == calculator._positions and sum(offsets.values()) else None

        covered = wait_until(covers_all, 30, "a checkpoint of everything metered")

    # The tail: usage metered while no calculator ran from the checkpoint.
    with running_api(s.model_copy(update={"checkpoint_every_s": 0}), NOW) as (api, _):
        _meter_all(s, later, tmp_path / "logs2", api.app.state.store)  # type: ignore[attr-defined]

    resumed, usage, resumed_from = _restarted(s, NOW)
    assert resumed_from == covered  # loaded, and only what follows it read
    replayed, replayed_usage, none = _restarted(s.model_copy(update={"checkpoint_every_s": 0}), NOW)
    assert none is None
    assert resumed["nodes"] == replayed["nodes"] and usage == replayed_usage
    factors = {n["node_id"]: n["factor"] for n in resumed["nodes"]}
    assert factors["olmo-ft"] > 0 and factors["vision"] > 0

    # Not trusted: a body that does not match its checksum; offsets the topic does not hold.
    text = checkpoint.read_bytes()
    checkpoint.write_bytes(text[:-8] + bytes(8))
    altered = _restarted(s, NOW)
    header, body = text.split(b"\n", 1)
    ahead = orjson.loads(header)
    ahead["offsets"][s.ledger_entries_topic]["0"] += 1_000
    checkpoint.write_bytes(orjson.dumps(ahead) + b"\n" + body)
    beyond = _restarted(s, NOW)
    for restarted in (altered, beyond):
        assert restarted[2] is None  # replayed from the beginning
        assert restarted[0]["nodes"] == replayed["nodes"] and restarted[1] == replayed_usage
