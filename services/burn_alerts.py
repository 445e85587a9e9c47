"""The burn alerter: every `alert_check_s`, judge every project's burn and warn once per crossing.

Each round (`check_once`, in a worker thread when run by the loop):

1. catch up the alerts topic (`<prefix>.alerts`, one partition): at the first round, or `rebuild`,
   from its beginning, so a restarted alerter knows which warnings are active and sends none again;
2. ask the source for every project's `ProjectBurn` (the current period's burn rate and idle time)
   and set the per-project gauges (`services/project_metrics.py`);
3. `domain.burn_alerts.evaluate` gives the crossings: `BurnWarningRaised` / `BurnWarningCleared`;
4. publish them (acks=all, idempotent producer) and only once the broker has them fold them in;
   a round whose publication fails raises, changes nothing, and the next round emits the same
   events under the same ids;
5. POST each to every `alert_webhook_urls` URL as a Slack-compatible body (`slack_body`): a timeout,
   retries with backoff on transport errors, 429 and 5xx; a post that still fails is logged and
   counted (`allmende_alert_webhook_failures_total`), the event stays published.

Thresholds come from `burn_warning_days_early` and `burn_warning_budget_shares`. Two alerters on
one topic (two API processes) catch up before judging, and would in a race publish the same event
ids, which the fold takes once (a webhook could then get a warning twice).

Wiring (allmende/topology.py, in the API process, after `ensure_topics`; the source runs in a worker
thread, so it may block on ClickHouse):

    def burns() -> list[ProjectBurn]:  # each project's current period
        return [ProjectBurn(project, period, burn_rate(...), idle_units) for ... in ...]

    alerter = BurnAlerter(s, burns)
    await alerter.start()       # replays the alerts topic (in a thread), then runs the loop
    ...
    yield
    ...
    await alerter.stop()        # ends the loop, waits for a round in progress, closes clients

`last_error` holds the last failed round's error (None after a good round), for `/healthz`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import structlog
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from allmende.core.clickhouse import background_queries
from allmende.core.kafka_reading import read_to_end, replaying_consumer
from allmende.core.metrics import (
    ALERT_WEBHOOK_FAILURES,
    ALERT_WEBHOOK_POSTS,
    ALERTS,
    BURN_ALERT_ROUND_FAILURES,
    BURN_ALERTS_PUBLISHED,
    CLUSTER_OVER_CAPACITY_GPUS,
    register,
)
from allmende.core.settings import Settings
from allmende.domain.admission import gpu_hours
from allmende.domain.burn_alerts import BurnAlertState, ProjectBurn, Thresholds, evaluate
from allmende.domain.capacity import Found, capacity_alerts
from allmende.domain.squat_alerts import SquatFound, keep_ongoing, squat_alerts
from allmende.schemas.alert_events import (
    AlertEvent,
    BurnWarningRaised,
    CapacityExceeded,
    SquattingFlagged,
    encode_alert_event,
    parse_alert_event,
)
from allmende.schemas.events import ContractError
from allmende.services.alert_mail import AlertMailer
from allmende.services.project_metrics import ProjectMetrics

log = structlog.get_logger(__name__)

Source = Callable[[], Sequence[ProjectBurn]]
# Clusters run above their capacity, each with the runs on it then (services/capacity_queries.py).
CapacitySource = Callable[[], Sequence[Found]]
# The jobs squatting now, and the ledger's clock they are judged at (services/api/dashboard_views.py).
SquatSource = Callable[[], tuple[Sequence[SquatFound], int]]

WEBHOOK_TIMEOUT_S = 5.0
WEBHOOK_ATTEMPTS = 4
WEBHOOK_BACKOFF_S = 0.5  # doubled after every failed attempt


def webhook_urls(settings: Settings) -> list[str]:
    return [u.strip() for u in settings.alert_webhook_urls.split(",") if u.strip()]


def slack_body(event: AlertEvent) -> dict[str, Any]:
    """A Slack-compatible incoming-webhook body: `text` (the sentence) and two blocks."""
    if isinstance(event, CapacityExceeded):
        figures = (
            f"`{event.cluster}` · {event.peak_gpus} GPUs in use of {event.capacity_gpus} · "
            f"projects: {', '.join(event.projects) or 'none'}"
        )
        return _body(":rotating_light:", event.message, figures)
    if isinstance(event, SquattingFlagged):
        figures = (
            f"`{event.job_id}` · {event.project} · user {event.user or '?'} · leads "
            f"{', '.join(event.leads) or 'none'} · {event.gpus} GPUs idle since <!date^{event.idle_since}"
            f"^{{date_short_pretty}} {{time}}|{event.idle_since}>"
        )
        return _body(":zzz:", event.message, figures)
    raised = isinstance(event, BurnWarningRaised)
    figures = (
        f"`{event.project}` · {event.period} · {event.condition} · allocated "
        f"{gpu_hours(event.allocated_units)}, charged {gpu_hours(event.charged_units)}, held "
        f"{gpu_hours(event.held_units)}, remaining {gpu_hours(event.remaining_units)} weighted GPU-hours"
    )
    return _body(":warning:" if raised else ":white_check_mark:", event.message, figures)


def _body(mark: str, message: str, figures: str) -> dict[str, Any]:
    return {
        "text": message,
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": f"{mark} {message}"}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": figures}]},
        ],
    }


class BurnAlerter:
    """Burn warnings on the alerts topic and the webhooks, and the project gauges; thread-safe."""

    def __init__(
        self,
        settings: Settings,
        source: Source,
        *,
        capacity: CapacitySource | None = None,
        dispute: Callable[[Sequence[Found]], object] | None = None,
        squatting: SquatSource | None = None,
        clock: Callable[[], float] = time.time,
        metrics: ProjectMetrics | None = None,
        webhook_attempts: int = WEBHOOK_ATTEMPTS,
        webhook_backoff_s: float = WEBHOOK_BACKOFF_S,
        webhook_timeout_s: float = WEBHOOK_TIMEOUT_S,
    ) -> None:
        register(ALERTS)
        self.settings = settings
        self.source = source
        self.capacity = capacity
        self.dispute = dispute  # holds the runs that pushed a cluster over as disputed usage
        self.squatting = squatting
        # Published by this alerter but not yet posted: a publication that failed may have reached
        # the topic all the same, and the next round then finds it there instead of emitting it
        # again; it is posted when folded (what another alerter published it posts itself).
        self._unposted: dict[str, AlertEvent] = {}
        self._gauged: set[str] = set()  # clusters whose over-capacity gauge was ever set
        self.clock = clock
        self.thresholds = Thresholds.parse(
            settings.burn_warning_days_early,
            settings.burn_warning_budget_shares,
            settings.burn_warning_expiry_days,
        )
        self.webhook_urls = webhook_urls(settings)
        self.mailer = AlertMailer(settings) if AlertMailer.enabled(settings) else None
        self._leads: dict[str, tuple[str, ...]] = {}  # project -> its leads, from the latest round
        self.metrics = metrics or ProjectMetrics()
        self.state = BurnAlertState()
        self.last_error: str | None = None
        self._attempts = max(1, webhook_attempts)
        self._backoff_s = webhook_backoff_s
        self._timeout_s = webhook_timeout_s
        self._lock = threading.Lock()  # one round at a time; close waits for it
        self._stop = threading.Event()
        self._consumer: KafkaConsumer | None = None
        self._partitions: list[TopicPartition] = []
        self._producer: KafkaProducer | None = None
        self._http: httpx.Client | None = None
        self._task: asyncio.Task[None] | None = None

    # -- life cycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        """Rebuild the active warnings from the topic, then check every `alert_check_s`."""
        self._stop.clear()
        await asyncio.to_thread(self.rebuild)
        self._task = asyncio.create_task(self.run(), name="burn-alerter")

    async def run(self) -> None:
        """The loop: a round in a worker thread, then a pause; a failed round is logged, counted
        and tried again next time."""
        while not self._stop.is_set():
            try:
                await asyncio.to_thread(self.check_once)
                self.last_error = None
            except Exception as exc:
                BURN_ALERT_ROUND_FAILURES.inc()
                self.last_error = repr(exc)
                log.warning("burn_alert_round_failed", error=repr(exc))
            await asyncio.sleep(self.settings.alert_check_s)

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        """Close the clients (after the round in progress); the next round would reopen them."""
        with self._lock:
            if self._consumer is not None:
                self._consumer.close(autocommit=False)
                self._consumer = None
            if self._producer is not None:
                self._producer.close(timeout=5)
                self._producer = None
            if self._http is not None:
                self._http.close()
                self._http = None

    # -- the topic -----------------------------------------------------------------------------
    def rebuild(self, timeout: float = 30.0) -> int:
        """Fold the alerts topic from its beginning to its end; returns the events read."""
        with self._lock:
            if self._consumer is not None:
                self._consumer.close(autocommit=False)
                self._consumer = None
            self.state = BurnAlertState()
            count = self._catch_up(timeout)
            log.info("alerts_log_replayed", events=count, active=len(self.state.active))
            return count

    def _catch_up(self, timeout: float = 30.0) -> int:
        if self._consumer is None:
            self._consumer, self._partitions = replaying_consumer(
                self.settings.kafka_bootstrap_servers, self.settings.alerts_topic
            )
        consumer = self._consumer
        return sum(read_to_end(consumer, tp, self._fold, timeout) for tp in self._partitions)

    def _fold(self, record: Any) -> None:
        try:
            event = parse_alert_event(record.value)
        except ContractError as exc:
            log.error("alert_event_unreadable", offset=record.offset, reason=exc.reason)
            return
        self.state.apply(event)
        mine = self._unposted.pop(event.event_id, None)
        if mine is not None:
            self._post_all(mine)

    def _publish(self, events: Sequence[AlertEvent], timeout: float = 30.0) -> None:
        if self._producer is None:
            self._producer = KafkaProducer(
                bootstrap_servers=self.settings.kafka_bootstrap_servers, acks="all", enable_idempotence=True
            )
        topic = self.settings.alerts_topic
        futures = [
            self._producer.send(topic, key=e.key.encode(), value=encode_alert_event(e), partition=0)
            for e in events
        ]
        for future in futures:
            future.get(timeout=timeout)

    # -- a round -------------------------------------------------------------------------------
    def check_once(self) -> list[AlertEvent]:
        """One round (blocking): the events it published, each posted to the webhooks."""
        with self._lock, background_queries():  # the sweeps yield the cores to the requests
            self._catch_up()
            burns = list(self.source())
            self._leads.update((b.project, b.leads) for b in burns)
            self.metrics.update(burns)
            now = int(self.clock())
            events: list[AlertEvent] = list(evaluate(burns, self.thresholds, self.state, now))
            if self.capacity is not None:
                events += self._capacity_round(self.capacity, now)
            if self.squatting is not None:
                events += self._squat_round(self.squatting, now)
            if not events:
                return []
            self._unposted.update((e.event_id, e) for e in events)
            self._publish(events)
            for event in events:
                self._unposted.pop(event.event_id, None)
                self.state.apply(event)
                BURN_ALERTS_PUBLISHED.labels(event.type).inc()
                if isinstance(event, SquattingFlagged):
                    log.warning(
                        "squatting_flagged", event_id=event.event_id, job_id=event.job_id,
                        project=event.project, user=event.user, gpus=event.gpus, idle_since=event.idle_since,
                    )  # fmt: skip
                elif isinstance(event, CapacityExceeded):
                    log.warning(
                        "capacity_exceeded", event_id=event.event_id, cluster=event.cluster,
                        peak_gpus=event.peak_gpus, capacity_gpus=event.capacity_gpus, jobs=event.jobs,
                    )  # fmt: skip
                else:
                    log.info(
                        "burn_warning", type=event.type, event_id=event.event_id, project=event.project,
                        period=event.period, condition=event.condition, message=event.message,
                    )  # fmt: skip
            for event in events:
                self._post_all(event)
            return events

    def _post_all(self, event: AlertEvent) -> None:
        for url in self.webhook_urls:
            self._post(url, event)
        if self.mailer is not None and isinstance(event, BurnWarningRaised):
            self.mailer.send(event, self._leads.get(event.project, ()))

    def _capacity_round(self, source: CapacitySource, now: int) -> list[AlertEvent]:
        """Clusters above capacity: the gauge, the disputes to raise, the alerts to publish. Its
        failure (a slow sweep, ClickHouse away) is logged and leaves the burn warnings alone."""
        try:
            found = list(source())
            self._gauge_capacity(found)
            if self.dispute is not None and found:
                self.dispute(found)
        except Exception as exc:
            log.warning("capacity_check_failed", error=repr(exc))
            return []
        return list(capacity_alerts(found, self.state.capacity, now))

    def _squat_round(self, source: SquatSource, now: int) -> list[AlertEvent]:
        """Jobs squatting now and not yet told (once per idle stretch). Its failure (ClickHouse
        away) is logged and leaves the other alerts alone."""
        try:
            found, as_of = source()
        except Exception as exc:
            log.warning("squat_check_failed", error=repr(exc))
            return []
        keep_ongoing(self.state.squats, found)  # what ended is never asked about again
        return list(squat_alerts(found, self.state.squats, now, as_of))

    def _gauge_capacity(self, found: Sequence[Found]) -> None:
        worst: dict[str, int] = {}
        for episode, _ in found:
            worst[episode.cluster] = max(worst.get(episode.cluster, 0), episode.excess)
        for cluster in set(self._gauged) - set(worst):
            CLUSTER_OVER_CAPACITY_GPUS.labels(cluster).set(0)
        for cluster, excess in worst.items():
            CLUSTER_OVER_CAPACITY_GPUS.labels(cluster).set(excess)
        self._gauged |= set(worst)

    # -- webhooks ------------------------------------------------------------------------------
    def _post(self, url: str, event: AlertEvent) -> bool:
        """POST the event's Slack body, retrying transport errors, 429 and 5xx with backoff."""
        if self._http is None:
            self._http = httpx.Client(timeout=self._timeout_s)
        where = _redacted(url)  # a Slack webhook's path is its secret
        body = slack_body(event)
        wait, problem = self._backoff_s, ""
        for attempt in range(1, self._attempts + 1):
            try:
                response = self._http.post(url, json=body)
                if response.is_success:
                    ALERT_WEBHOOK_POSTS.inc()
                    return True
                problem = f"HTTP {response.status_code}"
                if response.status_code != 429 and response.status_code < 500:
                    break  # the receiver refuses it: asking again will not help
            except httpx.HTTPError as exc:
                problem = repr(exc)
            if attempt < self._attempts:
                log.info("alert_webhook_retry", url=where, attempt=attempt, problem=problem)
                if self._stop.wait(wait):
                    break
                wait *= 2
        ALERT_WEBHOOK_FAILURES.inc()
        log.warning("alert_webhook_failed", url=where, event_id=event.event_id, problem=problem)
        return False


def _redacted(url: str) -> str:
    try:
        parsed = httpx.URL(url)
    except Exception:
        return "<invalid url>"
    return f"{parsed.scheme}://{parsed.netloc.decode()}"
