"""Names and sizes: one pattern for projects, groups, clusters and users, at the plan and the API.

docs/security.md ("Identifiers and sizes") states the rule; these tests hold both entry points to
it: the plan file (refusals with line and field) and the admin API's request models.
"""

from __future__ import annotations

import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, TypeAdapter, ValidationError

from allmende.domain.plan_file import MAX_GPU_HOURS, PlanInvalid, parse_plan
from allmende.schemas.events import MAX_GPUS, NAME_MAX_LENGTH, NAME_PATTERN, Name
from allmende.services.api.admin_models import (
    AgreementRequest,
    ClusterRequest,
    GrantRequest,
    NodeRequest,
    TransferRequest,
)
from tests.unit.test_plan import PLAN, edited

NAMES: TypeAdapter[str] = TypeAdapter(Name)
OLMO = "{project: olmo-ft, gpu_hours: "  # the start of the plan's first two allocations
DOC = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()

GOOD = ["olmo-ft", "ef-cluster01", "a", "7", "ada@lab.org", "team.vision", "x+y", "snake_case", "A" * 64]
BAD = [
    "", "../../etc", "..", ".", "a/b", "/abs", "a..b", ".hidden", "trailing.", "-flag", "_x", "a:b",
    "a b", " a", "a\n", "a\x00b", "a\tb", "tab\x7f", "é", "a%2Fb", "a\\b", "A" * 65,
]  # fmt: skip


@pytest.mark.parametrize("name", GOOD)
def test_a_name_of_the_pattern_is_accepted(name: str) -> None:
    assert NAMES.validate_python(name) == name


@pytest.mark.parametrize("name", BAD)
def test_a_name_with_a_slash_dots_a_colon_space_or_control_character_is_refused(name: str) -> None:
    with pytest.raises(ValidationError):
        NAMES.validate_python(name)


@given(st.text(max_size=80))
def test_the_checker_and_the_documented_pattern_agree(text: str) -> None:
    """Whatever the text: accepted exactly when the pattern (of the OpenAPI schema, of the doc) matches."""
    matches = re.fullmatch(NAME_PATTERN, text) is not None and len(text) <= NAME_MAX_LENGTH
    try:
        NAMES.validate_python(text)
        accepted = True
    except ValidationError:
        accepted = False
    assert accepted == matches
    if accepted:
        assert "/" not in text and ".." not in text and text.isprintable() and text.isascii()


def test_the_documented_pattern_and_bounds_are_the_code_s() -> None:
    assert NAME_PATTERN in DOC and f"at most {NAME_MAX_LENGTH} characters" in DOC
    assert f"1 .. {MAX_GPUS:,}" in DOC and f"0 .. {MAX_GPU_HOURS:,} weighted GPU-hours" in DOC
    assert NAMES.json_schema()["pattern"] == NAME_PATTERN


def _problems(text: str) -> list[tuple[int | None, str, str]]:
    with pytest.raises(PlanInvalid) as refused:
        parse_plan(text)
    return refused.value.problems


def _line_of(text: str, fragment: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if fragment in line)


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("{id: vision, parent: institute", "{id: ../../etc, parent: institute", "organisation.2.id"),
        ("{id: olmo-ft, parent: nlp", "{id: olmo-ft, parent: ../nlp", "organisation.0.parent"),
        ("leads: [alice]", "leads: ['al ice']", "organisation.0.leads.0"),
        ("{name: h100-a,", "{name: h100/a,", "clusters.0.name"),
        (f"{OLMO}1000}}", "{project: 'olmo:ft', gpu_hours: 1000}", "allocations.0.project"),
        (f"{OLMO}250.5, cluster: b300-a", f"{OLMO}250.5, cluster: ..", "allocations.1.cluster"),
    ],
)  # fmt: skip
def test_a_plan_with_a_bad_name_is_refused_naming_the_line_and_field(old: str, new: str, field: str) -> None:
    text = edited(PLAN, old, new)
    (problem,) = _problems(text)
    assert problem[:2] == (_line_of(text, new), field)
    assert "is not a valid id" in problem[2]


def test_the_project_id_of_the_issue_is_refused_wherever_it_stands() -> None:
    text = edited(PLAN, "olmo-ft", "../../etc")  # the node, its allocations and its agreement
    fields = {field for _, field, _ in _problems(text)}
    assert {
        "organisation.0.id",
        "allocations.0.project",
        "allocations.1.project",
        "agreements.0.project",
    } <= fields


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("gpus: 64}", "gpus: 1000000}", "clusters.0.gpus"),
        ("gpus: 64}", "gpus: 0}", "clusters.0.gpus"),
        ("gpus: 32", "gpus: 100001", "agreements.0.gpus"),
        (f"{OLMO}1000}}", f"{OLMO}1000000001}}", "allocations.0.gpu_hours"),
        (f"{OLMO}1000}}", f"{OLMO}-1}}", "allocations.0.gpu_hours"),
        ("leads: [alice]", f"leads: [{', '.join(f'u{i}' for i in range(101))}]", "organisation.0.leads"),
    ],
)  # fmt: skip
def test_a_plan_out_of_bounds_is_refused_naming_the_line_and_field(old: str, new: str, field: str) -> None:
    text = edited(PLAN, old, new)
    (problem,) = _problems(text)
    assert problem[:2] == (_line_of(text, new), field)


def test_the_largest_sizes_are_accepted() -> None:
    text = edited(PLAN, "gpus: 64}", f"gpus: {MAX_GPUS}}}")
    text = edited(text, f"{OLMO}1000}}", f"{OLMO}{MAX_GPU_HOURS}}}")
    plan = parse_plan(text)
    assert plan.clusters[0].gpus == MAX_GPUS and plan.allocations[0].gpu_hours == MAX_GPU_HOURS


ADMIN_REQUESTS: list[tuple[type[BaseModel], dict[str, Any], list[str]]] = [
    (NodeRequest, {"node_id": "olmo-ft", "kind": "project", "parent": "nlp", "leads": ["alice"]},
     ["node_id", "parent"]),
    (ClusterRequest, {"cluster": "h100-a", "gpu_type": "H100", "gpus": 64}, ["cluster"]),
    (GrantRequest, {"project": "olmo-ft", "period": "2027-Q1", "gpu_hours": "10", "cluster": "h100-a"},
     ["project", "cluster"]),
    (AgreementRequest, {"agreement_id": "a1", "project": "olmo-ft", "cluster": "h100-a", "gpus": 8,
                        "window": {"kind": "fixed", "start": 1_800_000_000, "end": 1_800_003_600}},
     ["project", "cluster"]),
]  # fmt: skip


@pytest.mark.parametrize(("model", "body", "names"), ADMIN_REQUESTS)
def test_the_admin_api_takes_the_plan_s_names_and_refuses_others(
    model: type[BaseModel], body: dict[str, Any], names: list[str]
) -> None:
    model.model_validate(body)
    for field in names:
        for bad in ("../../etc", "a/b", "a:b", "a\x00b", "x" * 65):
            with pytest.raises(ValidationError) as refused:
                model.model_validate({**body, field: bad})
            assert refused.value.errors()[0]["loc"][0] == field
    if "leads" in body:
        with pytest.raises(ValidationError):
            model.model_validate({**body, "leads": ["../root"]})


@pytest.mark.parametrize(
    ("model", "body", "field", "too_big"),
    [
        (ClusterRequest, ADMIN_REQUESTS[1][1], "gpus", MAX_GPUS + 1),
        (AgreementRequest, ADMIN_REQUESTS[3][1], "gpus", MAX_GPUS + 1),
        (GrantRequest, ADMIN_REQUESTS[2][1], "gpu_hours", Decimal(MAX_GPU_HOURS) + 1),
        (TransferRequest, {"from_allocation": "a/2027-Q1", "to_allocation": "b/2027-Q1", "gpu_hours": "1"},
         "gpu_hours", Decimal(MAX_GPU_HOURS) + 1),
    ],
)  # fmt: skip
def test_the_admin_api_refuses_sizes_past_the_bounds(
    model: type[BaseModel], body: dict[str, Any], field: str, too_big: Any
) -> None:
    model.model_validate(body)
    with pytest.raises(ValidationError) as refused:
        model.model_validate({**body, field: too_big})
    assert refused.value.errors()[0]["loc"] == (field,)


def test_a_cluster_of_a_million_gpus_is_refused_by_both() -> None:
    with pytest.raises(ValidationError):
        ClusterRequest.model_validate({"cluster": "big", "gpu_type": "H100", "gpus": 1_000_000})
    (problem,) = _problems(edited(PLAN, "gpus: 64}", "gpus: 1000000}"))
    assert problem[1] == "clusters.0.gpus" and "100000" in problem[2]
