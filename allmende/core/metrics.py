"""Every Prometheus metric of Allmende, and `/metrics` for the processes without an HTTP API.

The metric objects are created here, once, and imported by the modules that update them: grouped
below by that component. Each object is named after its metric, without `allmende_` and `_total`.
They are created outside any registry: a component registers its group (`register`) when it is
built, so a process exports the metrics of the components it runs, and nothing else (a meter
worker shows no writer lag).

The API process serves `/metrics` on its own port (with the embedded writer's metrics in it); the
meter workers and standalone writers serve theirs with `serve_metrics`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import structlog
from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.metrics import MetricWrapperBase

from allmende.core.settings import Settings

log = structlog.get_logger(__name__)


def _counter(name: str, documentation: str, labelnames: Sequence[str] = ()) -> Counter:
    return Counter(name, documentation, labelnames, registry=None)


def _gauge(name: str, documentation: str, labelnames: Sequence[str] = ()) -> Gauge:
    return Gauge(name, documentation, labelnames, registry=None)


def _histogram(
    name: str,
    documentation: str,
    labelnames: Sequence[str] = (),
    buckets: Sequence[float] = Histogram.DEFAULT_BUCKETS,
) -> Histogram:
    return Histogram(name, documentation, labelnames, registry=None, buckets=buckets)


# Garbage-collector pauses: updated by allmende.core.gc_pauses (the API process).
GC_PAUSE_SECONDS = _histogram(
    "allmende_gc_pause_seconds",
    "Garbage-collector pauses, by generation (2: full)",
    ["generation"],
    buckets=(1e-4, 1e-3, 5e-3, 2e-2, 1e-1, 0.5),
)

# The metering worker: updated by allmende.streams.meter.
METER_EVENTS = _counter("allmende_meter_events_total", "Job events metered")
METER_DEAD_LETTERS = _counter("allmende_meter_dead_letters_total", "Job events sent to dead letter")
METER_LAG_RECORDS = _gauge(
    "allmende_meter_lag_records",
    "Job events on the partition after the last one this worker metered (as of its last batch)",
    ["partition"],
)
METER_RETIRED_JOBS = _counter(
    "allmende_meter_retired_jobs_total",
    "Ended jobs whose meter state was deleted (table and changelog) after the retention period",
)
METER_LATE_EVENTS = _counter(
    "allmende_meter_late_events_total",
    "Events of a job with no meter state, older than the retention behind their partition (dead-lettered)",
)
METER_SKIPPED_GAPS = _counter(
    "allmende_meter_skipped_gaps_total",
    "Times the consumer handed the meter records past ones it skipped; the partition was sought back"
    " (streams/offset_continuity.py)",
)

# The sample writer: updated by allmende.streams.sample_writer.
GPU_SAMPLES = _counter(
    "allmende_gpu_samples_total",
    "GPU sample records written, by what they made: idle (a row under the squatting cap), busy,"
    " no-job (a node's GPUs with no job), refused (dead-lettered)",
    ["outcome"],
)
SAMPLE_LAG_RECORDS = _gauge(
    "allmende_sample_writer_lag_records", "GPU sample records behind the end of the topic", ["partition"]
)

# The decision writer: updated by allmende.streams.decision_writer.
DECISIONS_WRITTEN = _counter(
    "allmende_decision_writer_decisions_total", "Admission decisions written to ClickHouse (decision history)"
)
DECISION_RECORDS_SKIPPED = _counter(
    "allmende_decision_writer_records_skipped_total",
    "Admission-log records not written: void (appended after their record-by instant) or unreadable",
    ["why"],
)

# The ledger writer: updated by allmende.streams.ledger_writer.
WRITER_ENTRIES_READ = _counter("allmende_writer_entries_read_total", "Ledger-entry records consumed")
WRITER_POSTINGS_WRITTEN = _counter("allmende_writer_postings_written_total", "Postings appended")
WRITER_ENTRIES_STALE = _counter(
    "allmende_writer_entries_stale_total", "Entry versions already in the ledger (redelivery)"
)
WRITER_DEAD_LETTERS = _counter("allmende_writer_dead_letters_total", "Records refused by the writer")
WRITER_BATCH_SECONDS = _histogram("allmende_writer_batch_seconds", "Time to post one batch")
WRITER_LAG_RECORDS = _gauge(
    "allmende_writer_lag_records", "Records behind the end of the topic", ["partition"]
)

# The admin log's fold: updated by allmende.streams.admin_log.
ADMIN_EVENTS_APPLIED = _counter("allmende_admin_events_applied_total", "Admin events folded into the state")
ADMIN_EVENTS_REFUSED = _counter("allmende_admin_events_refused_total", "Admin records sent to dead letter")

# The fair-share calculator: updated by allmende.streams.fairshare_calculator.
FAIRSHARE_SNAPSHOTS = _counter("allmende_fairshare_snapshots_total", "Fair-share snapshots published")
FAIRSHARE_FACTOR = _gauge("allmende_fairshare_factor", "Fair-share factor of a project", ["project"])
FAIRSHARE_LAG_RECORDS = _gauge(
    "allmende_fairshare_lag_records", "Ledger-entry records the calculator is behind"
)

# The admission service: updated by allmende.services.admission_service.
ADMISSION_DECISIONS = _counter(
    "allmende_admission_decisions_total", "Admission decisions", ["verdict", "lane"]
)
ADMISSION_RETIRED_JOBS = _counter(
    "allmende_admission_retired_jobs_total",
    "Ended jobs (and decisions never run) the admission service let go of after the retention period",
)
ADMISSION_LATE_EVENTS = _counter(
    "allmende_admission_late_events_total",
    "Events of a job admission no longer holds, older than the retention behind their partition (ignored)",
)
ADMISSION_LEADING = _gauge(
    "allmende_admission_leading", "1 while this instance decides and writes; 0 while it stands by"
)
ADMISSION_ELECTIONS = _counter(
    "allmende_admission_elections_total", "Times this instance took the lead of the admission log"
)
ADMISSION_DECIDE_SECONDS = _histogram(
    "allmende_admission_decide_seconds",
    "Time to decide (without publishing)",
    buckets=(1e-4, 3e-4, 1e-3, 3e-3, 1e-2),
)

# Group commits onto a partition: updated by allmende.services.group_commit.
# The wait every answer pays for durability: the floor under the admission latency.
GROUP_COMMIT_SECONDS = _histogram(
    "allmende_group_commit_seconds",
    "From a group's send to the broker's acknowledgement of all its batches",
    ["topic"],
    buckets=(5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.25, 1.0),
)
GROUP_COMMIT_CALLERS = _histogram(
    "allmende_group_commit_callers",
    "Callers whose records share one group commit",
    ["topic"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 512),
)

# The Kueue AdmissionCheck controller: updated by allmende.integrations.kueue.controller.
KUEUE_CHECKS_SET = _counter("allmende_kueue_checks_total", "Workload checks set, by state", ["state"])
KUEUE_JOB_EVENTS = _counter("allmende_kueue_job_events_total", "Job events put in the spool")
KUEUE_ERRORS = _counter(
    "allmende_kueue_errors_total", "Failed calls (admission API, Kubernetes API, Kafka)", ["kind"]
)
KUEUE_DECIDE_SECONDS = _histogram(
    "allmende_kueue_decide_seconds",
    "From picking up a workload's pending check to its state written",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)

# The burn alerter's rounds and webhooks: updated by allmende.services.burn_alerts.
BURN_ALERTS_PUBLISHED = _counter("allmende_burn_alerts_published_total", "Burn warnings published", ["type"])
CLUSTER_OVER_CAPACITY_GPUS = _gauge(
    "allmende_cluster_over_capacity_gpus",
    "GPUs in use above the cluster's capacity at the worst instant of the alerter's look-back (0: none)",
    ["cluster"],
)
BURN_ALERT_ROUND_FAILURES = _counter("allmende_burn_alert_round_failures_total", "Alert rounds that failed")
ALERT_WEBHOOK_POSTS = _counter("allmende_alert_webhook_posts_total", "Alert webhook posts delivered")
ALERT_WEBHOOK_FAILURES = _counter(
    "allmende_alert_webhook_failures_total", "Alert webhook posts given up after their retries"
)
ALERT_MAILS = _counter(
    "allmende_alert_mails_total", "Alert e-mails handed to the SMTP server, by outcome", ["outcome"]
)

# Per-project budget gauges (documented there): updated by allmende.services.project_metrics.
PROJECT_LABELS = ("project", "period")
PROJECT_ALLOCATED_GPU_HOURS = _gauge(
    "allmende_project_allocated_gpu_hours", "Allocated weighted GPU-hours", PROJECT_LABELS
)
PROJECT_CHARGED_GPU_HOURS = _gauge(
    "allmende_project_charged_gpu_hours", "Charged weighted GPU-hours up to as_of", PROJECT_LABELS
)
PROJECT_HELD_GPU_HOURS = _gauge(
    "allmende_project_held_gpu_hours", "Weighted GPU-hours held by admitted jobs", PROJECT_LABELS
)
PROJECT_REMAINING_GPU_HOURS = _gauge(
    "allmende_project_remaining_gpu_hours", "Allocated - charged - held, weighted GPU-hours", PROJECT_LABELS
)
PROJECT_FORECAST_DAYS_LEFT = _gauge(
    "allmende_project_forecast_days_left",
    "Whole days until the budget runs out at the trailing 7 days' rate (absent: it lasts the period)",
    PROJECT_LABELS,
)
PROJECT_LASTS_PERIOD = _gauge(
    "allmende_project_lasts_period",
    "1 when the budget lasts the period at the trailing 7 days' rate",
    PROJECT_LABELS,
)
PROJECT_PERIOD_DAYS_LEFT = _gauge(
    "allmende_project_period_days_left", "Days from as_of to the period's end", PROJECT_LABELS
)
PROJECT_IDLE_GPU_HOURS = _gauge(
    "allmende_project_idle_gpu_hours", "GPU-hours held at low utilisation in the period", PROJECT_LABELS
)

# The DCGM collector (`allmende collect dcgm`).
DCGM_SCRAPES = _counter(
    "allmende_dcgm_scrapes_total",
    "Nodes read, by outcome (ok, timeout, unreachable, http-error, unparsable): only ok is read",
    ["outcome"],
)
DCGM_SAMPLES_PUBLISHED = _counter("allmende_dcgm_samples_published_total", "GPU samples published")
DCGM_PUBLISH_FAILURES = _counter(
    "allmende_dcgm_publish_failures_total", "Rounds whose samples Kafka did not take (kept, sent again)"
)
DCGM_FREE_GPUS = _gauge(
    "allmende_dcgm_free_gpus", "GPUs with no job on them, idle, at the last read", ["node"]
)
DCGM_UNACCOUNTED_GPUS = _gauge(
    "allmende_dcgm_unaccounted_gpus", "GPUs busy with no job on them (use nobody is charged for)", ["node"]
)

# Each component's group, registered when the component is built.
GC = (GC_PAUSE_SECONDS,)
METER = (
    METER_EVENTS,
    METER_DEAD_LETTERS,
    METER_LAG_RECORDS,
    METER_RETIRED_JOBS,
    METER_LATE_EVENTS,
    METER_SKIPPED_GAPS,
)
KUEUE = (KUEUE_CHECKS_SET, KUEUE_JOB_EVENTS, KUEUE_ERRORS, KUEUE_DECIDE_SECONDS)
WRITER = (
    WRITER_ENTRIES_READ, WRITER_POSTINGS_WRITTEN, WRITER_ENTRIES_STALE, WRITER_DEAD_LETTERS,
    WRITER_BATCH_SECONDS, WRITER_LAG_RECORDS,
)  # fmt: skip
DECISION_WRITER = (DECISIONS_WRITTEN, DECISION_RECORDS_SKIPPED)
SAMPLE_WRITER = (GPU_SAMPLES, SAMPLE_LAG_RECORDS)
ADMIN_LOG = (ADMIN_EVENTS_APPLIED, ADMIN_EVENTS_REFUSED)
FAIRSHARE = (FAIRSHARE_SNAPSHOTS, FAIRSHARE_FACTOR, FAIRSHARE_LAG_RECORDS)
ADMISSION = (
    ADMISSION_DECISIONS, ADMISSION_DECIDE_SECONDS, ADMISSION_RETIRED_JOBS, ADMISSION_LATE_EVENTS,
    ADMISSION_LEADING, ADMISSION_ELECTIONS,
)  # fmt: skip
GROUP_COMMIT = (GROUP_COMMIT_SECONDS, GROUP_COMMIT_CALLERS)
DCGM = (DCGM_SCRAPES, DCGM_SAMPLES_PUBLISHED, DCGM_PUBLISH_FAILURES, DCGM_FREE_GPUS, DCGM_UNACCOUNTED_GPUS)
ALERTS = (
    BURN_ALERTS_PUBLISHED, BURN_ALERT_ROUND_FAILURES, ALERT_WEBHOOK_POSTS, ALERT_WEBHOOK_FAILURES,
    ALERT_MAILS, CLUSTER_OVER_CAPACITY_GPUS,
)  # fmt: skip
PROJECT = (
    PROJECT_ALLOCATED_GPU_HOURS, PROJECT_CHARGED_GPU_HOURS, PROJECT_HELD_GPU_HOURS,
    PROJECT_REMAINING_GPU_HOURS, PROJECT_FORECAST_DAYS_LEFT, PROJECT_LASTS_PERIOD,
    PROJECT_PERIOD_DAYS_LEFT, PROJECT_IDLE_GPU_HOURS,
)  # fmt: skip

_registered: set[int] = set()
_registering = threading.Lock()


def register(group: Sequence[MetricWrapperBase]) -> None:
    """Export `group` from this process (idempotent: components of a kind may be built many times)."""
    with _registering:
        for metric in group:
            if id(metric) not in _registered:
                REGISTRY.register(metric)
                _registered.add(id(metric))


def serve_metrics(settings: Settings, process: str, port: int) -> int | None:
    """Serve this process's metrics on ALLMENDE_METRICS_HOST:`port` (0: not at all); the port is
    returned. A port already taken (a second worker on the host) is a warning, not a reason to
    stop working: give each process its own port."""
    if not port:
        return None
    try:
        start_http_server(port, addr=settings.metrics_host)
    except OSError as exc:
        log.warning("metrics_not_served", process=process, port=port, error=str(exc),
                    hint=f"set ALLMENDE_{process.upper()}_METRICS_PORT per process")  # fmt: skip
        return None
    log.info("metrics_served", process=process, url=f"http://{settings.metrics_host}:{port}/metrics")
    return port
