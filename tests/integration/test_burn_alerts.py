"""The burn alerter on a real broker: once per crossing on the alerts topic, across restarts, to
real webhooks (a local HTTP server), and the project gauges."""

from __future__ import annotations

import asyncio
import email.policy
import http.server
import threading
from collections.abc import Iterator, Sequence
from decimal import Decimal
from email.message import EmailMessage
from email.parser import BytesParser
from pathlib import Path
from typing import Any

import orjson
import pytest
from kafka import TopicPartition
from prometheus_client import REGISTRY

from allmende.core.kafka_local import free_port
from allmende.core.kafka_reading import read_to_end, replaying_consumer
from allmende.core.kafka_topics import ensure_topics, topic_specs
from allmende.core.settings import Settings
from allmende.domain.admission import UNITS_PER_GPU_HOUR
from allmende.domain.burn_alerts import EARLY_EXHAUSTION, ProjectBurn
from allmende.domain.squatting import IDLE_UNITS_PER_GPU_SECOND
from allmende.schemas.alert_events import AlertEvent, BurnWarningCleared, BurnWarningRaised, parse_alert_event
from allmende.services.burn_alerts import BurnAlerter, slack_body
from allmende.testing.budget_harness import ADMIN, ALICE, ok, plan_text, running_api
from allmende.testing.harness import wait_until
from tests.integration.test_budgets import Q1_2027, QUARTER_PLAN, _meter_all, _run
from tests.unit.test_burn_alerts import FAST, Q1_END, QUIET, burn_of

pytestmark = pytest.mark.integration
DAY = 86_400


class Webhook:
    """A local HTTP server that records every POSTed JSON body and answers the given statuses
    in turn (then 200)."""

    def __init__(self, statuses: Sequence[int] = ()) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.statuses = list(statuses)
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = orjson.loads(self.rfile.read(length))
                with lock:
                    hook.bodies.append(body)
                    status = hook.statuses.pop(0) if hook.statuses else 200
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        lock = threading.Lock()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/secret-path"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    hook = Webhook()
    yield hook
    hook.close()


@pytest.fixture
def alerts_settings(settings: Settings) -> Settings:
    ensure_topics(settings, [s for s in topic_specs(settings) if s.name == settings.alerts_topic])
    # The thresholds these tests count crossings of (the defaults add 0.5 and a 14-day reminder).
    return settings.model_copy(
        update={"burn_warning_budget_shares": "0.8,1.0", "burn_warning_expiry_days": ""}
    )


class Source:
    """What the ledger would say: the burns the test sets."""

    def __init__(self, *burns: ProjectBurn) -> None:
        self.burns = list(burns)
        self.calls = 0

    def __call__(self) -> list[ProjectBurn]:
        self.calls += 1
        return self.burns


def on_topic(settings: Settings) -> list[AlertEvent]:
    consumer, _ = replaying_consumer(settings.kafka_bootstrap_servers, settings.alerts_topic)
    events: list[AlertEvent] = []
    try:
        read_to_end(consumer, TopicPartition(settings.alerts_topic, 0), lambda r: events.append(
            parse_alert_event(r.value)
        ))  # fmt: skip
    finally:
        consumer.close(autocommit=False)
    return events


def sample(name: str, labels: dict[str, str]) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def counter(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def test_a_crossing_is_emitted_once_across_rounds_and_restarts(
    alerts_settings: Settings, webhook: Webhook
) -> None:
    s = alerts_settings.model_copy(update={"alert_webhook_urls": f" {webhook.url} ,"})
    p = s.topic_prefix  # a project name of this test's own
    source = Source(ProjectBurn(p, "2027-Q1", FAST, 0))
    first = BurnAlerter(s, source)
    try:
        [event] = first.check_once()
        assert isinstance(event, BurnWarningRaised) and event.condition == EARLY_EXHAUSTION
        assert first.check_once() == []
    finally:
        first.close()
    assert on_topic(s) == [event]
    assert webhook.bodies == [orjson.loads(orjson.dumps(slack_body(event)))]
    assert webhook.bodies[0]["text"] == (
        f"Project {p} will run out of budget on 2027-02-20, 39 days before 2027-Q1 ends "
        "(last 7 days' rate: 120 weighted GPU-hours/day)."
    )

    restarted = BurnAlerter(s, source)
    try:
        assert restarted.rebuild() == 1
        assert restarted.state.active == {(p, "2027-Q1", EARLY_EXHAUSTION): 1}
        assert restarted.check_once() == []
        # the lead sees it end, once
        source.burns = [ProjectBurn(p, "2027-Q1", QUIET, 0)]
        [cleared] = restarted.check_once()
        assert isinstance(cleared, BurnWarningCleared) and cleared.crossing == 1
        assert restarted.check_once() == []
    finally:
        restarted.close()
    assert on_topic(s) == [event, cleared]
    assert [b["text"] for b in webhook.bodies] == [event.message, cleared.message]

    # a third alerter that never rebuilt explicitly catches up at its first round
    third = BurnAlerter(s, source)
    try:
        assert third.check_once() == []
    finally:
        third.close()
    assert len(webhook.bodies) == 2


def test_a_webhook_answering_500_is_retried_and_one_that_keeps_failing_is_counted(
    alerts_settings: Settings,
) -> None:
    flaky, broken = Webhook([500]), Webhook([500, 503, 502, 500, 500])
    s = alerts_settings.model_copy(update={"alert_webhook_urls": f"{flaky.url},{broken.url}"})
    p = s.topic_prefix
    failures, posts = (
        counter("allmende_alert_webhook_failures_total"),
        counter("allmende_alert_webhook_posts_total"),
    )
    alerter = BurnAlerter(s, Source(ProjectBurn(p, "2027-Q1", burn_of(charged_h=8_500), 0)),
                          webhook_attempts=3, webhook_backoff_s=0.05)  # fmt: skip
    try:
        [event] = alerter.check_once()  # the loop's round does not fail for a webhook
    finally:
        alerter.close()
        flaky.close()
        broken.close()
    assert event.condition == "budget-share:0.8"
    assert flaky.bodies == [slack_body(event)] * 2  # 500, then 200
    assert broken.bodies == [slack_body(event)] * 3  # given up after 3 attempts
    assert counter("allmende_alert_webhook_posts_total") == posts + 1
    assert counter("allmende_alert_webhook_failures_total") == failures + 1
    assert on_topic(s) == [event]  # published before the posts, whatever they answer


def test_the_gauges_show_each_project_and_drop_what_is_no_longer_reported(alerts_settings: Settings) -> None:
    p = alerts_settings.topic_prefix
    idle_units = 25 * 3600 * IDLE_UNITS_PER_GPU_SECOND // 10  # 2.5 idle GPU-hours
    fast, quiet = (
        {"project": f"{p}-fast", "period": "2027-Q1"},
        {"project": f"{p}-quiet", "period": "2027-Q1"},
    )
    source = Source(ProjectBurn(fast["project"], "2027-Q1", FAST, idle_units),
                    ProjectBurn(quiet["project"], "2027-Q1", QUIET, 0))  # fmt: skip
    alerter = BurnAlerter(alerts_settings, source)
    try:
        alerter.check_once()
        assert sample("allmende_project_allocated_gpu_hours", fast) == 10_000
        assert sample("allmende_project_charged_gpu_hours", fast) == 7_660
        assert sample("allmende_project_held_gpu_hours", fast) == 0
        assert sample("allmende_project_remaining_gpu_hours", fast) == 2_340
        assert sample("allmende_project_forecast_days_left", fast) == 19
        assert sample("allmende_project_lasts_period", fast) == 0
        assert sample("allmende_project_period_days_left", fast) == 59
        assert sample("allmende_project_idle_gpu_hours", fast) == 2.5
        assert sample("allmende_project_charged_gpu_hours", quiet) == 1_000
        assert sample("allmende_project_forecast_days_left", quiet) is None  # lasts: absent
        assert sample("allmende_project_lasts_period", quiet) == 1
        source.burns = source.burns[:1]
        alerter.check_once()
        assert sample("allmende_project_allocated_gpu_hours", quiet) is None
        assert sample("allmende_project_allocated_gpu_hours", fast) == 10_000
    finally:
        alerter.close()
        alerter.metrics.clear()
    assert sample("allmende_project_allocated_gpu_hours", fast) is None


def test_the_loop_runs_rounds_off_the_event_loop_and_survives_a_failing_source(
    alerts_settings: Settings, webhook: Webhook
) -> None:
    s = alerts_settings.model_copy(update={"alert_webhook_urls": webhook.url, "alert_check_s": 0.1})
    p = s.topic_prefix
    calls: list[str] = []

    def source() -> list[ProjectBurn]:
        calls.append(threading.current_thread().name)
        if len(calls) == 1:
            raise RuntimeError("ClickHouse away")
        return [ProjectBurn(p, "2027-Q1", FAST, 0)]

    async def main() -> BurnAlerter:
        alerter = BurnAlerter(s, source)
        await alerter.start()
        try:
            await asyncio.to_thread(wait_until, lambda: len(calls) >= 4, 30, "four rounds")
        finally:
            await alerter.stop()
        return alerter

    failures = counter("allmende_burn_alert_round_failures_total")
    alerter = asyncio.run(main())
    assert counter("allmende_burn_alert_round_failures_total") >= failures + 1
    assert threading.main_thread().name not in calls
    assert len(on_topic(s)) == 1 and len(webhook.bodies) == 1
    assert alerter.last_error is None
    alerter.metrics.clear()


def test_the_running_api_warns_from_the_ledger_once_and_its_gauges_are_the_burn_pages(
    settings: Settings, webhook: Webhook, tmp_path: Path
) -> None:
    s = settings.model_copy(update={"alert_webhook_urls": webhook.url, "alert_check_s": 0.2})
    # vision: 448 of its 500 GPU-hours in one day (89.6 %): past 0.5 and 0.8 (the defaults), not
    # 1.0, and the trailing rate runs out long before the quarter ends.
    big = _run("big", "vision", start=Q1_2027 + DAY, end=Q1_2027 + DAY + 7 * 3600, gpus=64)
    vision = {"project": "vision", "period": "2027-Q1"}
    with running_api(s, Q1_2027 + DAY) as (api, clock):
        ok(api.post("/v1/admin/plan/apply", json={"text": plan_text(QUARTER_PLAN)}, headers=ADMIN))
        _meter_all(s, big, tmp_path / "logs", api.app.state.store)  # type: ignore[attr-defined]
        clock.now = Q1_2027 + 2 * DAY
        raised = wait_until(lambda: len(on_topic(s)) == 3 and on_topic(s), 30, "three burn warnings")
        burn = ok(api.get("/v1/dashboard/projects/vision/burn", headers=ADMIN))
        metrics = api.get("/metrics").text
        assert ok(api.get("/healthz"))["alerts"] == "running"
    assert {(e.type, e.project, e.condition) for e in raised} == {
        ("BurnWarningRaised", "vision", "budget-share:0.5"),
        ("BurnWarningRaised", "vision", "budget-share:0.8"),
        ("BurnWarningRaised", "vision", EARLY_EXHAUSTION),
    }
    assert 'allmende_project_charged_gpu_hours{period="2027-Q1",project="vision"}' in metrics
    assert sample("allmende_project_charged_gpu_hours", vision) == float(burn["charged_gpu_hours"])
    assert sample("allmende_project_remaining_gpu_hours", vision) == float(burn["remaining_gpu_hours"])
    assert sorted(b["text"] for b in webhook.bodies) == sorted(e.message for e in raised)

    with running_api(s, Q1_2027 + 2 * DAY) as (api, _):  # restarted: the warnings are not sent again
        assert api.app.state.alerter.check_once() == []  # type: ignore[attr-defined]
    assert len(on_topic(s)) == 3 and len(webhook.bodies) == 3


class PublishedButFailed(BurnAlerter):
    """Its first publication reaches the topic, then fails as if the acknowledgement were lost."""

    failed = False

    def _publish(self, events: Sequence[AlertEvent], timeout: float = 30.0) -> None:
        super()._publish(events, timeout)
        if not self.failed:
            self.failed = True
            raise TimeoutError("the acknowledgement was lost")


def test_a_warning_published_by_a_round_that_failed_is_still_posted_once(
    alerts_settings: Settings, webhook: Webhook
) -> None:
    s = alerts_settings.model_copy(update={"alert_webhook_urls": webhook.url})
    alerter = PublishedButFailed(s, Source(ProjectBurn(s.topic_prefix, "2027-Q1", FAST, 0)))
    try:
        with pytest.raises(TimeoutError):
            alerter.check_once()
        assert webhook.bodies == []
        assert alerter.check_once() == []  # found on the topic: not published again...
        assert alerter.check_once() == []
    finally:
        alerter.close()
    [event] = on_topic(s)
    assert webhook.bodies == [orjson.loads(orjson.dumps(slack_body(event)))]  # ...but posted, once


def test_a_job_squatting_now_is_told_to_its_user_and_leads_once_and_its_busy_neighbour_is_not(
    settings: Settings, webhook: Webhook, tmp_path: Path
) -> None:
    from allmende.schemas.alert_events import SquattingFlagged
    from allmende.schemas.events import JobFinished
    from tests.integration.test_dashboard import _job

    s = settings.model_copy(update={"alert_webhook_urls": webhook.url, "alert_check_s": 0.2})
    start = Q1_2027 + DAY
    # Both still running (no JobFinished): one idle for 40 minutes at 1 %, one busy beside it.
    running = [
        e
        for e in (
            *_job("parked", "olmo-ft", start, [0.01] * 4, gpus=8, user="squatter"),
            *_job("busy", "olmo-ft", start, [0.9] * 4, gpus=8, user="bea"),
        )
        if not isinstance(e, JobFinished)
    ]
    with running_api(s, start) as (api, clock):
        ok(api.post("/v1/admin/plan/apply", json={"text": plan_text(QUARTER_PLAN)}, headers=ADMIN))
        _meter_all(s, running, tmp_path / "logs", api.app.state.store)  # type: ignore[attr-defined]
        clock.now = start + 3600

        def flagged() -> list[AlertEvent] | None:
            found = [e for e in on_topic(s) if isinstance(e, SquattingFlagged)]
            return found or None

        (event,) = wait_until(flagged, 30, "the squatting job flagged")
        page = ok(api.get("/v1/dashboard/projects/olmo-ft/squatting", headers=ALICE))["rows"]
        again = api.app.state.alerter.check_once()  # type: ignore[attr-defined]
    assert isinstance(event, SquattingFlagged)
    assert (event.job_id, event.user, event.project, event.gpus) == ("parked", "squatter", "olmo-ft", 8)
    assert event.leads == ["alice", "dana"]  # the project's lead and the institute's above it
    assert event.idle_since == start and event.gpu_seconds == 8 * 40 * 60 == event.idle_gpu_seconds
    assert [r["job_id"] for r in page] == ["parked"]  # the page and the alert agree
    charged = (Decimal(event.charge_units) / UNITS_PER_GPU_HOUR).quantize(Decimal("0.000000001"))
    assert Decimal(page[0]["charged_gpu_hours"]) == charged
    assert again == [] and [b["text"] for b in webhook.bodies] == [event.message]
    assert "squatter" in event.message and "alice, dana" in event.message and "8 GPUs" in event.message


class Mailbox:
    """A real SMTP server (aiosmtpd) on a free loopback port, keeping every message it is sent."""

    def __init__(self) -> None:
        from aiosmtpd.controller import Controller

        self.messages: list[tuple[list[str], EmailMessage]] = []
        box = self

        class Handler:
            async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
                parsed = BytesParser(policy=email.policy.default).parsebytes(envelope.original_content)
                box.messages.append((list(envelope.rcpt_tos), parsed))  # type: ignore[arg-type]
                return "250 OK"

        self.controller = Controller(Handler(), hostname="127.0.0.1", port=free_port())
        self.controller.start()
        self.port = self.controller.port


def test_a_reminder_and_a_budget_crossing_are_mailed_to_the_leads_once(alerts_settings: Settings) -> None:
    mailbox = Mailbox()
    s = alerts_settings.model_copy(update={
        "burn_warning_budget_shares": "0.5", "burn_warning_expiry_days": "14",
        "smtp_host": "127.0.0.1", "smtp_port": mailbox.port, "smtp_from": "gpu-budgets@example.org",
        "lead_emails": "lena:lena.k@example.org", "email_address_template": "{name}@staff.example.org",
    })  # fmt: skip
    p = s.topic_prefix
    half_spent_near_the_end = burn_of(as_of=Q1_END - 10 * DAY, charged_h=6_000, rate_h=10)
    source = Source(ProjectBurn(p, "2027-Q1", half_spent_near_the_end, 0, ("lena", "gina")))
    sent = sample("allmende_alert_mails_total", {"outcome": "sent"}) or 0.0
    alerter = BurnAlerter(s, source)
    try:
        events = alerter.check_once()
        assert sorted(e.condition for e in events) == ["budget-share:0.5", "expires-in:14d"]
        assert alerter.check_once() == []  # once per crossing
    finally:
        alerter.close()
        mailbox.controller.stop()
    assert len(mailbox.messages) == 2
    by_subject = {m["Subject"]: (to, m) for to, m in mailbox.messages}
    to, reminder = by_subject[f"[Allmende] {p} 2027-Q1: expires-in:14d"]
    assert sorted(to) == ["gina@staff.example.org", "lena.k@example.org"]
    assert reminder["From"] == "gpu-budgets@example.org"
    assert "allocations end on 2027-04-01, in 10 days" in reminder.get_content()
    _, crossing = by_subject[f"[Allmende] {p} 2027-Q1: budget-share:0.5"]
    assert f"Project {p} has spent 50% of its 2027-Q1 budget" in crossing.get_content()
    assert sample("allmende_alert_mails_total", {"outcome": "sent"}) == sent + 2


def test_an_smtp_server_away_loses_no_warning(alerts_settings: Settings) -> None:
    s = alerts_settings.model_copy(update={"smtp_host": "127.0.0.1", "smtp_port": free_port(),
                                           "email_address_template": "{name}@example.org"})  # fmt: skip
    failed = sample("allmende_alert_mails_total", {"outcome": "failed"}) or 0.0
    alerter = BurnAlerter(
        s, Source(ProjectBurn(s.topic_prefix, "2027-Q1", burn_of(charged_h=8_500), 0, ("lena",)))
    )
    try:
        [event] = alerter.check_once()
    finally:
        alerter.close()
    assert on_topic(s) == [event]  # published, whatever the mail server did
    assert sample("allmende_alert_mails_total", {"outcome": "failed"}) == failed + 1
