"""The fair-share calculator on the real ledger stream: factors, publishing, rebuild by replay."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from kafka import KafkaProducer

from allmende.core.settings import Settings
from allmende.domain.fairshare.compute import compute_fairshare
from allmende.domain.fairshare.options import Algorithm
from allmende.domain.fairshare.usage import decayed_usage, share_tree
from allmende.schemas.fairshare import FairShareRecord
from allmende.testing.budget_harness import ADMIN, ok, plan_text, running_api
from allmende.testing.harness import read_topic, wait_until
from tests.integration.test_budgets import NOW, QUARTER_PLAN, _meter_all, _run

pytestmark = pytest.mark.integration


def _fast(settings: Settings, algorithm: str = "fair_tree") -> Settings:
    return settings.model_copy(update={"fairshare_publish_s": 0.2, "fairshare_algorithm": algorithm})


def _settled(api: Any, as_of: int) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        response = api.get("/v1/fairshare", headers=ADMIN)
        if response.status_code != 200:
            return None
        body: dict[str, Any] = response.json()
        return body if body["as_of"] == as_of and body["caught_up"] else None

    return wait_until(ready, 60, f"a fair-share snapshot as of {as_of}")


@pytest.mark.parametrize("algorithm", ["fair_tree", "classic"])
def test_factors_follow_usage_against_shares_and_are_rebuilt_identically_by_replay(
    settings: Settings, tmp_path: Path, algorithm: str
) -> None:
    s = _fast(settings, algorithm)
    olmo = _run("job-olmo", "olmo-ft", start=NOW - 7200, end=NOW, gpus=4)
    vision = _run("job-vision", "vision", start=NOW - 3600, end=NOW, gpus=8)
    with running_api(s, NOW) as (api, _):
        ok(api.post("/v1/admin/plan/apply", json={"text": plan_text(QUARTER_PLAN)}, headers=ADMIN))
        store = api.app.state.store  # type: ignore[attr-defined]
        _meter_all(s, olmo + vision, tmp_path / "logs", store)
        body = _settled(api, NOW)
        admin_state = api.app.state.admin.state()  # type: ignore[attr-defined]

    factors = {n["node_id"]: n["factor"] for n in body["nodes"]}
    # Equal GPU-hours: nlp (60 shares) is further below its share than vision (40).
    assert factors["olmo-ft"] > factors["vision"] > 0
    assert body["nodes"][0]["node_id"] == "root"

    # The same figures as the maths on the ledger's charges (8 weighted GPU-hours each).
    hours: dict[str, dict[int, int]] = {}
    for project, gpus, start, end in (("olmo-ft", 4, NOW - 7200, NOW), ("vision", 8, NOW - 3600, NOW)):
        for t in range(start, end):  # one second at a time: no shared cutting code
            hours.setdefault(project, {}).setdefault(t // 3600, 0)
            hours[project][t // 3600] += gpus * 10**6
    usage = decayed_usage(hours, NOW, s.fairshare_half_life_s)
    tree, leaves = share_tree(admin_state.nodes, usage)
    expected = compute_fairshare(tree, leaves, Algorithm(algorithm))
    assert factors == pytest.approx(expected.factor_map(), abs=1e-12)

    # Published: the compacted topic holds every node's row; ClickHouse keeps the history.
    latest: dict[str, FairShareRecord] = {}
    for raw in read_topic(s, s.fairshare_topic, 10_000, timeout=5):
        record = FairShareRecord.model_validate_json(raw)
        latest[record.node_id] = record
    assert {k: v.factor for k, v in latest.items()} == factors

    # A restart rebuilds everything from the stream, and duplicates on it change nothing.
    duplicates = read_topic(s, s.ledger_entries_topic, 10_000, timeout=5)
    producer = KafkaProducer(bootstrap_servers=s.kafka_bootstrap_servers, acks="all")
    for raw in duplicates:  # entries (an array, keyed by job) and the meter's attributions (an object)
        data = orjson.loads(raw)
        producer.send(
            s.ledger_entries_topic,
            value=raw,
            key=data[0]["job_id"].encode() if isinstance(data, list) else None,
        )
    producer.flush()
    producer.close()
    with running_api(s, NOW) as (api, _):
        rebuilt = _settled(api, NOW)
        history = api.app.state.store.db.rows(  # type: ignore[attr-defined]
            "SELECT count(), uniqExact(as_of) FROM {db}.fairshare_history FINAL WHERE node_id = 'olmo-ft'"
        )[0]
    assert rebuilt["nodes"] == body["nodes"]
    assert history[0] >= 1 and history[1] >= 1
