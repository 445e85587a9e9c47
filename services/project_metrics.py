"""Per-project budget gauges for Prometheus, labelled `project` and `period`: their values.

The gauges are defined in `allmende/core/metrics.py`; `ProjectMetrics` sets them each round, for
the burn alerter (`services/burn_alerts.py`), from the same `ProjectBurn`s it judges; the API's
`/metrics` serves them (the default registry). Weighted GPU-hours are charge
units / 3.6e9; idle GPU-hours are idle units / 10,000 / 3600 (`domain.squatting`).

| gauge | value |
|---|---|
| `allmende_project_allocated_gpu_hours` | allocated, weighted GPU-hours |
| `allmende_project_charged_gpu_hours` | charged in the period up to as_of |
| `allmende_project_held_gpu_hours` | held by admitted jobs (counts as spent) |
| `allmende_project_remaining_gpu_hours` | allocated - charged - held (negative: over budget) |
| `allmende_project_forecast_days_left` | whole days to the trailing-7-day exhaustion; **absent**: it lasts |
| `allmende_project_lasts_period` | 1 when the trailing-7-day forecast lasts the period, else 0 |
| `allmende_project_period_days_left` | days from as_of to the period's end |
| `allmende_project_idle_gpu_hours` | GPU-hours jobs held at low utilisation in the period |

`forecast_days_left` is absent rather than NaN when the budget lasts: a rule such as
`allmende_project_forecast_days_left < 7` then fires only for budgets that do run out, and
`min()` over projects stays a number. The early-exhaustion warning in PromQL:
`allmende_project_period_days_left - allmende_project_forecast_days_left > 7`.
A (project, period) the source stops reporting loses its series.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence

from prometheus_client import Gauge

from allmende.core.metrics import (
    PROJECT,
    PROJECT_ALLOCATED_GPU_HOURS,
    PROJECT_CHARGED_GPU_HOURS,
    PROJECT_FORECAST_DAYS_LEFT,
    PROJECT_HELD_GPU_HOURS,
    PROJECT_IDLE_GPU_HOURS,
    PROJECT_LASTS_PERIOD,
    PROJECT_PERIOD_DAYS_LEFT,
    PROJECT_REMAINING_GPU_HOURS,
    register,
)
from allmende.domain.admission import UNITS_PER_GPU_HOUR
from allmende.domain.burn_alerts import ProjectBurn
from allmende.domain.burn_rate import SECONDS_PER_DAY
from allmende.domain.squatting import IDLE_UNITS_PER_GPU_SECOND

IDLE_UNITS_PER_GPU_HOUR = IDLE_UNITS_PER_GPU_SECOND * 3600

ALWAYS = (
    PROJECT_ALLOCATED_GPU_HOURS,
    PROJECT_CHARGED_GPU_HOURS,
    PROJECT_HELD_GPU_HOURS,
    PROJECT_REMAINING_GPU_HOURS,
    PROJECT_LASTS_PERIOD,
    PROJECT_PERIOD_DAYS_LEFT,
    PROJECT_IDLE_GPU_HOURS,
)
ALL = (*ALWAYS, PROJECT_FORECAST_DAYS_LEFT)


class ProjectMetrics:
    """Sets the gauges from a round's burns and removes the series of pairs no longer reported."""

    def __init__(self) -> None:
        register(PROJECT)
        self._lock = threading.Lock()
        self._shown: set[tuple[str, str]] = set()

    def update(self, burns: Sequence[ProjectBurn]) -> None:
        with self._lock:
            now: set[tuple[str, str]] = set()
            for pb in burns:
                labels = (pb.project, pb.period)
                now.add(labels)
                b = pb.burn
                PROJECT_ALLOCATED_GPU_HOURS.labels(*labels).set(b.allocated_units / UNITS_PER_GPU_HOUR)
                PROJECT_CHARGED_GPU_HOURS.labels(*labels).set(b.charged_units / UNITS_PER_GPU_HOUR)
                PROJECT_HELD_GPU_HOURS.labels(*labels).set(b.held_units / UNITS_PER_GPU_HOUR)
                PROJECT_REMAINING_GPU_HOURS.labels(*labels).set(b.remaining_units / UNITS_PER_GPU_HOUR)
                PROJECT_LASTS_PERIOD.labels(*labels).set(1 if b.trailing_7d.lasts_period else 0)
                PROJECT_PERIOD_DAYS_LEFT.labels(*labels).set(max(0, b.period_end - b.as_of) / SECONDS_PER_DAY)
                PROJECT_IDLE_GPU_HOURS.labels(*labels).set(pb.idle_units / IDLE_UNITS_PER_GPU_HOUR)
                days_left = b.trailing_7d.days_left
                if days_left is None:
                    _remove(PROJECT_FORECAST_DAYS_LEFT, labels)
                else:
                    PROJECT_FORECAST_DAYS_LEFT.labels(*labels).set(days_left)
            for labels in self._shown - now:
                for gauge in ALL:
                    _remove(gauge, labels)
            self._shown = now

    def clear(self) -> None:
        """Remove every series this instance set."""
        self.update(())


def _remove(gauge: Gauge, labels: tuple[str, str]) -> None:
    with contextlib.suppress(KeyError):  # never set
        gauge.remove(*labels)
