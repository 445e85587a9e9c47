"""Every admission decision in ClickHouse, exactly once: `GET /v1/admission/{job_id}` answers for
any job ever decided, whether the admission service still holds it in memory or not."""

from __future__ import annotations

from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from allmende.core.kafka_reading import record_by_header
from allmende.core.ledger_store import LedgerStore
from allmende.core.settings import Settings
from allmende.schemas.admission_events import AdmissionDecided, encode_admission_event
from allmende.streams.decision_writer import DecisionWriter
from allmende.testing.budget_harness import ADMIN, SCHEDULER, ok, plan_text, running_api
from allmende.testing.harness import wait_until
from tests.integration.test_admission import PLAN, TUESDAY_NOON, _ask, _job

pytestmark = pytest.mark.integration


def _rows(store: LedgerStore, final: bool = True) -> int:
    sql = f"SELECT count() FROM {{db}}.admission_decisions{' FINAL' if final else ''}"
    return int(store.db.rows(sql)[0][0])


def _end_of_log(settings: Settings) -> int:
    consumer = KafkaConsumer(bootstrap_servers=settings.kafka_bootstrap_servers)
    try:
        tp = TopicPartition(settings.admission_topic, 0)
        return int(consumer.end_offsets([tp])[tp])
    finally:
        consumer.close()


def _written_to_end(settings: Settings, store: LedgerStore, name: str) -> None:
    """Wait until the writer named `name` saved the offset past the admission log's last record."""
    end = _end_of_log(settings)
    wait_until(lambda: store.offsets(name, settings.admission_topic).get(0) == end, 30, "decisions written")


def _decide_a_few(api: Any) -> dict[str, dict[str, Any]]:
    """Admits, a reject, a queue asked again (attempt 2), a dry run (not recorded), a host report
    and holds on the log beside them; the last answer per job."""
    ok(api.post("/v1/admin/plan/apply", json={"text": plan_text(PLAN)}, headers=ADMIN))
    answers = {}
    for body in (
        _job("fill", "olmo-ft", 52, priority_class="non-preemptible"),
        _job("v1", "vision", 16, hours=2),  # 12 GPUs left: queued
        _job("b1", "broke", 4, hours=2),  # over budget
        _job("v1", "vision", 16, hours=2),  # asked again: attempt 2
        _job("v2", "vision", 4),
    ):
        answers[body["job_id"]] = _ask(api, body)
    _ask(api, _job("dry", "vision", 1), dry_run=True)
    report = {"cluster": "h100-a", "host": "h7", "healthy": False, "reason": "ECC errors"}
    ok(api.post("/v1/hosts/health", json=report, headers=SCHEDULER))
    assert answers["v1"]["attempt"] == 2 and answers["v1"]["verdict"] == "queue"
    assert answers["b1"]["verdict"] == "reject" and answers["v2"]["verdict"] == "admit"
    return answers


def test_every_decision_is_in_clickhouse_once_also_after_a_writer_reads_the_log_again(
    settings: Settings,
) -> None:
    with running_api(settings, TUESDAY_NOON) as (api, _):
        answers = _decide_a_few(api)
        store: LedgerStore = api.app.state.store  # type: ignore[attr-defined]
        running: DecisionWriter = api.app.state.decision_writer  # type: ignore[attr-defined]
        name = running.consumer_name
        _written_to_end(settings, store, name)
        # fill, v1 (attempts 1 and 2), b1, v2: the dry run, holds and host report are not decisions
        assert _rows(store) == _rows(store, final=False) == 5
        assert {j: store.decision(j).attempt for j in answers} == {  # type: ignore[union-attr]
            "fill": 1, "v1": 2, "b1": 1, "v2": 1,
        }  # fmt: skip
        assert store.decision("dry") is None
        vision = store.decisions_of("vision")
        assert [(d.job_id, d.attempt) for d in vision] == [("v1", 1), ("v1", 2), ("v2", 1)]
        assert store.decisions_of("vision", since=TUESDAY_NOON + 1) == []

        # A restart resumes from the offset saved beside the decisions: nothing is read twice.
        running.stop()
        resumed = DecisionWriter(settings, store)
        resumed.start()
        try:
            answers["v3"] = _ask(api, _job("v3", "vision", 1))
            _written_to_end(settings, store, name)
            assert _rows(store) == _rows(store, final=False) == 6
        finally:
            resumed.stop()

        # As after a crash between the INSERT and the offsets: the whole log is read again. The
        # rows come again, and are one row per job and attempt all the same.
        store.save_offsets(name, settings.admission_topic, {0: 0})
        again = DecisionWriter(settings, store)
        again.start()
        try:
            _written_to_end(settings, store, name)
        finally:
            again.stop()
        assert _rows(store, final=False) == 12 and _rows(store) == 6
        for job_id, answer in answers.items():
            assert ok(api.get(f"/v1/admission/{job_id}", headers=SCHEDULER)) == answer


def test_a_decision_let_go_of_in_memory_is_answered_from_clickhouse_the_same(settings: Settings) -> None:
    with running_api(settings, TUESDAY_NOON) as (api, _):
        answers = _decide_a_few(api)
        service = api.app.state.admission  # type: ignore[attr-defined]
        store: LedgerStore = api.app.state.store  # type: ignore[attr-defined]
        _written_to_end(settings, store, api.app.state.decision_writer.consumer_name)  # type: ignore[attr-defined]
        for job_id, answer in answers.items():
            del service.state.decisions[job_id]  # as the service's retirement does
            assert service.decision(job_id) is None
            assert ok(api.get(f"/v1/admission/{job_id}", headers=SCHEDULER)) == answer
        missing = api.get("/v1/admission/never-asked", headers=SCHEDULER)
        assert missing.status_code == 404 and "never-asked" in missing.text
        assert api.get("/v1/admission/dry", headers=SCHEDULER).status_code == 404  # a dry run: not recorded


def test_a_void_record_and_an_unreadable_one_are_not_written(settings: Settings) -> None:
    with running_api(settings, TUESDAY_NOON) as (api, _):
        ok(api.post("/v1/admin/plan/apply", json={"text": plan_text(PLAN)}, headers=ADMIN))
        first = _ask(api, _job("v1", "vision", 1))
        service = api.app.state.admission  # type: ignore[attr-defined]
        decided: AdmissionDecided = service.decision("v1")
        store: LedgerStore = api.app.state.store  # type: ignore[attr-defined]

        # A decision delivered after its record-by instant (the requester was answered 503): void.
        late = decided.model_copy(update={"job_id": "late", "event_id": "decision:late:1"})
        after = decided.model_copy(update={"job_id": "after", "event_id": "decision:after:1"})
        producer = KafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers, acks="all")
        try:
            topic = settings.admission_topic
            producer.send(topic, key=b"late", value=encode_admission_event(late), headers=record_by_header(1))
            producer.send(topic, key=b"junk", value=b"not an admission event")
            producer.send(topic, key=b"after", value=encode_admission_event(after))
            producer.flush()
        finally:
            producer.close()
        _written_to_end(settings, store, api.app.state.decision_writer.consumer_name)  # type: ignore[attr-defined]
        assert store.decision("after") == after  # read past both, and still writing
        assert store.decision("late") is None
        assert api.get("/v1/admission/late", headers=SCHEDULER).status_code == 404
        assert ok(api.get("/v1/admission/v1", headers=SCHEDULER)) == first
        assert api.app.state.decision_writer.records_unreadable == 1  # type: ignore[attr-defined]
        assert _rows(store) == 2
