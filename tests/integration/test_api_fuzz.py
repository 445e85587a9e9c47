"""Fuzzing every operation of the API's OpenAPI schema: whatever a client sends, no answer is a 5xx.

Schemathesis generates requests from the app's own schema: valid ones (positive), which must be
answered or refused with a 4xx, and ones that break the schema (negative), which must be refused.
The app runs in this process under `TestClient`, so its lifespan starts the admission service,
the ledger writer and the fair-share calculator against the real broker and chDB. Schemathesis
only generates the cases and checks the answers: its own ASGI transport would start a second
lifespan on an event loop of its own, and the admission service's Kafka producer belongs to the
loop that started it.

A plan is applied first and some jobs admitted and started, and half of the valid cases have their
names swapped for known ones (projects, the cluster, allocations, jobs, hosts): random identifiers
alone stop at "unknown project" and never reach the budget, admission and preemption code.

Every operation is fuzzed even after one fails; the test then fails with, per failing operation,
the smallest request found (as curl) and the server's traceback.
"""

from __future__ import annotations

import os
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Err

from allmende.core.settings import Settings
from allmende.schemas.events import JobEvent, JobStarted, JobSubmitted
from allmende.testing.budget_harness import FakeClock, ok, plan_text, set_clock
from allmende.testing.harness import send_events, wait_until
from allmende.topology import create_app
from tests.integration.test_admission import PLAN as ADMISSION_PLAN

pytestmark = pytest.mark.integration

ADMIN = {"Authorization": "Bearer fuzz-admin-secret"}
SCHEDULER = {"Authorization": "Bearer fuzz-sched-secret"}
NOW = 1_799_755_200  # Tuesday 2027-01-12 12:00 UTC, inside the plan's quarter

# Examples per operation: 22 operations x (positive + negative) take about 20 s on 2 cores.
# ALLMENDE_FUZZ_EXAMPLES=500 fuzzes longer (valid cases; a third as many invalid ones).
POSITIVE_EXAMPLES = int(os.environ.get("ALLMENDE_FUZZ_EXAMPLES", "50"))
NEGATIVE_EXAMPLES = max(1, POSITIVE_EXAMPLES // 3)

PLAN = ADMISSION_PLAN.replace("admission-2027-q1", "fuzz-2027-q1")
# The same plan grown: a new project with its budget, one budget raised (a plan applies in full).
BROKE = "  - {id: broke, parent: institute, kind: project, shares: 10}\n"
BROKE_BUDGET = "  - {project: broke, gpu_hours: 1}\n"
PLAN_CHANGED = (
    PLAN.replace(BROKE, BROKE + "  - {id: fuzz-new, parent: institute, kind: project, shares: 5}\n")
    .replace(BROKE_BUDGET, BROKE_BUDGET + "  - {project: fuzz-new, gpu_hours: 5}\n")
    .replace("{project: vision, gpu_hours: 500}", "{project: vision, gpu_hours: 800}")
)
Case = schemathesis.Case[Any]
Operation = schemathesis.APIOperation[Any, Any, Any, Any]
ADMITTED = ("fuzz-job-1", "fuzz-job-2")
HOSTS = ("gpu-001", "gpu-002")


@dataclass(frozen=True)
class Finding:
    operation: str
    mode: str
    request: str
    error: str


def _known_values(allocations: list[str]) -> dict[str, st.SearchStrategy[Any]]:
    """Values that reach past "unknown", by the field (or parameter) that carries them, at any depth."""
    names: dict[str, list[Any]] = {
        "project": ["olmo-ft", "vision", "broke"],
        "node_id": ["olmo-ft", "vision", "broke", "institute", "fuzz-new"],
        "parent": ["institute", "olmo-ft"],
        "cluster": ["h100-a"],
        "gpu_type": ["H100"],
        "period": ["2027-Q1", "2027-Q2"],
        "allocation_id": allocations,
        "from_allocation": allocations,
        "to_allocation": allocations,
        "agreement_id": ["olmo-nightly", "fuzz-agreement"],
        "policy_id": ["prices"],
        "job_id": list(ADMITTED),
        "host": list(HOSTS),
        "time_zone": ["Europe/Berlin", "UTC", "Nowhere/Atlantis"],
        "effective_from": ["2027-01-01T00:00:00Z", "2027-02-01T00:00:00+01:00", "2027-02-01T00:00:00"],
        "requested_hours": [0.5, 1, 24, "1.5"],
        "gpu_hours": [1, 10.5, "100"],
        "text": [plan_text(PLAN), plan_text(PLAN_CHANGED)],
    }
    values: dict[str, st.SearchStrategy[Any]] = {k: st.sampled_from(v) for k, v in names.items()}
    # Seeded jobs (for the reads and the "same id, other job" conflict) and new ones, to be decided.
    values["job_id"] = st.one_of(st.uuids().map(lambda u: f"fuzz-{u.hex[:12]}"), values["job_id"])
    values["gpus"] = st.one_of(st.integers(1, 8), st.integers(0, 80))  # the cluster has 64
    values["valid_from"] = values["valid_until"] = st.integers(NOW - 86_400 * 30, NOW + 86_400 * 30)
    values["priority_multipliers"] = st.just({"preemptible": 0.5, "standard": 1, "non-preemptible": "2.00"})
    values["gpu_type_weights"] = st.sampled_from([{}, {"H100": 1.5}])
    values["window"] = st.one_of(
        st.fixed_dictionaries({"kind": st.just("fixed"), "start": values["valid_from"],
                               "end": values["valid_until"]}),
        st.fixed_dictionaries({"kind": st.just("weekly"), "weekdays": st.lists(st.integers(0, 6), max_size=7),
                               "hour": st.integers(0, 23), "duration_s": st.integers(1, 86_400),
                               "time_zone": values["time_zone"], "valid_from": values["valid_from"],
                               "valid_until": values["valid_until"]}),
    )  # fmt: skip
    return values


def _with_known_values(value: Any, data: st.DataObject, known: dict[str, st.SearchStrategy[Any]]) -> None:
    """Swap the generated values of known fields for known ones, in place, in dicts at any depth."""
    if isinstance(value, dict):
        for field in list(value):
            if field in known:
                value[field] = data.draw(known[field], label=field)
            else:
                _with_known_values(value[field], data, known)
    elif isinstance(value, list):
        for item in value:
            _with_known_values(item, data, known)


def _send(client: TestClient, case: Case, headers: dict[str, str]) -> httpx.Response:
    """The case as schemathesis would send it, through the TestClient that owns the app's event loop."""
    kwargs = case.as_transport_kwargs(base_url=str(client.base_url), headers=headers)
    body: dict[str, Any] = {}
    if "json" in kwargs:
        body["json"] = kwargs["json"]
    elif kwargs.get("data") is not None:
        data = kwargs["data"]
        body["content"] = data.encode() if isinstance(data, str) else data
    response: httpx.Response = client.request(
        kwargs["method"], kwargs["url"], params=kwargs.get("params"), headers=kwargs["headers"], **body
    )
    return response


def _fuzz(
    api: TestClient,
    operation: Operation,
    mode: schemathesis.GenerationMode,
    headers: dict[str, str],
    known: dict[str, st.SearchStrategy[Any]],
    seen: Counter[int],
) -> Finding | None:
    """Fuzz one operation in one mode; the smallest failing request, if any, with its traceback."""
    examples = POSITIVE_EXAMPLES if mode is schemathesis.GenerationMode.POSITIVE else NEGATIVE_EXAMPLES
    last: list[Case] = []

    @hypothesis_settings(
        max_examples=examples,
        deadline=None,
        database=None,  # a fresh broker and database every run: old examples would not mean the same
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode), data=st.data())
    def run(case: Case, data: st.DataObject) -> None:
        last[:] = [case]
        if mode is schemathesis.GenerationMode.POSITIVE and data.draw(st.booleans(), label="known names"):
            for part in (case.body, case.path_parameters, case.query):
                _with_known_values(part, data, known)
        response = _send(api, case, headers)
        seen[response.status_code] += 1
        case.validate_response(response, checks=[not_a_server_error])

    try:
        run()
    except Unsatisfiable:
        return None  # nothing in the operation to break (no parameters, no body): no negative case
    except Exception as exc:
        # Hypothesis replays the smallest failing example last, then raises: `last` holds that case.
        request = last[0].as_curl_command(headers=headers, base_url="http://testserver") if last else "?"
        return Finding(operation.label, mode.value, request, "".join(traceback.format_exception(exc)))
    return None


@pytest.fixture
def fuzz_settings(settings: Settings) -> Settings:
    return settings.model_copy(
        update={
            "admin_tokens": "root:fuzz-admin-secret",
            "lead_tokens": "alice:fuzz-alice-secret",
            "scheduler_tokens": "slurm:fuzz-sched-secret",
        }
    )


@pytest.fixture
def api(fuzz_settings: Settings) -> Iterator[TestClient]:
    # raise_server_exceptions: an unhandled error comes back as the exception, with its traceback.
    with TestClient(create_app(fuzz_settings), raise_server_exceptions=True) as client:
        set_clock(client.app, FakeClock(NOW))  # type: ignore[arg-type]
        yield client


def _seed(api: TestClient, settings: Settings) -> list[str]:
    """The plan, two admitted jobs that then start on known hosts; the allocations' ids."""
    ok(api.post("/v1/admin/plan/apply", json={"text": plan_text(PLAN)}, headers=ADMIN))
    for job_id in ADMITTED:
        body = {"job_id": job_id, "project": "vision", "user": "ada", "cluster": "h100-a", "gpu_type": "H100",
                "gpus": 4, "requested_hours": 2, "priority_class": "preemptible"}  # fmt: skip
        ok(api.post("/v1/admission", json=body, headers=SCHEDULER))
    events: list[JobEvent] = []
    for job_id, host in zip(ADMITTED, HOSTS, strict=True):
        common: dict[str, Any] = {"producer": "fuzz", "job_id": job_id}
        events += [
            JobSubmitted(event_id=f"{job_id}:sub", occurred_at=NOW, project="vision", user="ada",
                         cluster="h100-a", gpu_type="H100", gpus=4, priority_class="preemptible",
                         requested_seconds=7200, **common),
            JobStarted(event_id=f"{job_id}:start", occurred_at=NOW, gpus=4, hosts=(host,), **common),
        ]  # fmt: skip
    send_events(settings, events)
    admission = api.app.state.admission  # type: ignore[attr-defined]
    wait_until(lambda: admission.jobs_caught_up.is_set(), 60, "the admission service to read the jobs")
    lines = ok(api.get("/v1/projects/olmo-ft/balance", headers=ADMIN))["allocations"]
    lines += ok(api.get("/v1/projects/vision/balance", headers=ADMIN))["allocations"]
    return [line["allocation_id"] for line in lines]


def test_no_request_to_any_operation_gets_a_server_error(api: TestClient, fuzz_settings: Settings) -> None:
    allocations = _seed(api, fuzz_settings)
    known = _known_values(allocations)
    schema = schemathesis.openapi.from_dict(api.app.openapi())  # type: ignore[attr-defined]
    operations: list[Operation] = []
    for result in schema.get_all_operations():
        if isinstance(result, Err):
            pytest.fail(f"the app's schema has an operation schemathesis cannot read: {result.err()}")
        operations.append(result.ok())
    assert len(operations) >= 20, "the schema lost its operations"

    # Admission first: the admin operations' fuzzing redeclares the cluster and the tree at random,
    # after which few admission requests get past "unknown" or "too many GPUs".
    operations.sort(key=lambda op: "admission" not in (op.tags or []))
    findings: list[Finding] = []
    statuses: dict[str, Counter[int]] = {}
    for operation in operations:
        headers = SCHEDULER if "admission" in (operation.tags or []) else ADMIN
        seen = statuses.setdefault(operation.label, Counter())
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            if finding := _fuzz(api, operation, mode, headers, known, seen):
                findings.append(finding)

    # What the fuzzing reached, shown with -s: mostly 4xx would mean it never got past validation.
    for label, counts in statuses.items():
        print(f"{label}: {dict(sorted(counts.items()))}")
    report = "\n\n".join(f"== {f.operation} ({f.mode})\n{f.request}\n{f.error}" for f in findings)
    assert not findings, f"{len(findings)} operation(s) answered 5xx (or failed):\n\n{report}"
