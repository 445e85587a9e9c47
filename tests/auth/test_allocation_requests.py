"""Leads ask for GPU-hours, admins decide (services/api/routes_requests.py), signed in through the
real Keycloak: the approval is the admin event a grant would be, so the balance, the history and
the plan diff show it; every step has its actor."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import httpx

from allmende.testing.budget_harness import plan_text
from allmende.testing.keycloak import PASSWORDS, Keycloak
from tests.auth.conftest import IDP_PLAN, IdpApi


def _as(api: IdpApi, keycloak: Keycloak, user: str) -> httpx.Client:
    token = keycloak.user_token(user, PASSWORDS[user])["access_token"]
    return httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def _ok(response: httpx.Response) -> Any:
    assert response.status_code == 200, f"{response.status_code}: {response.text}"
    return response.json()


def _allocated(client: httpx.Client, project: str) -> Decimal:
    lines = _ok(client.get(f"/v1/projects/{project}/balance"))["allocations"]
    return sum((Decimal(line["allocated_gpu_hours"]) for line in lines), Decimal(0))


def test_a_lead_asks_an_admin_approves_another_amount_and_the_books_show_it(
    keycloak: Keycloak, idp_api: IdpApi
) -> None:
    lena, viktor, ada = (_as(idp_api, keycloak, u) for u in ("lena", "viktor", "ada"))
    before = _allocated(lena, "nlp")
    asked = _ok(
        lena.post(
            "/v1/projects/nlp/requests",
            json={"kind": "gpu-hours", "gpu_hours": "400", "period": "2026-Q4", "reason": "ACL ablations"},
        )
    )["applied"][0]
    assert asked["type"] == "AllocationRequested" and asked["actor"] == "lena"
    request_id = asked["data"]["request_id"]

    # another project's lead sees none of it and cannot ask for nlp; a lead cannot decide
    assert viktor.get("/v1/projects/nlp/requests").status_code == 403
    assert viktor.post("/v1/projects/nlp/requests", json={"kind": "gpu-hours", "gpu_hours": "1",
                                                          "reason": "x"}).status_code == 403  # fmt: skip
    assert lena.get("/v1/admin/requests").status_code == 403
    refused = lena.post(f"/v1/admin/requests/{request_id}/decision", json={"decision": "approve"})
    assert refused.status_code == 403
    assert _allocated(lena, "nlp") == before  # asking grants nothing

    # the admin sees it open, approves 250 of the 400 with a comment
    assert [r["request_id"] for r in _ok(ada.get("/v1/admin/requests"))] == [request_id]
    decided = _ok(
        ada.post(
            f"/v1/admin/requests/{request_id}/decision",
            json={"decision": "approve", "gpu_hours": "250", "comment": "250 now, more in January"},
        )
    )["applied"]
    # nlp holds the plan's allocation for the quarter: the approval tops it up
    assert [e["type"] for e in decided] == ["AllocationAdjusted", "AllocationRequestDecided"]
    assert decided[0]["data"]["allocation_id"] == "nlp/2026-Q4"
    assert all(e["actor"] == "ada" for e in decided)
    assert _allocated(lena, "nlp") == before + 250
    assert _ok(ada.get("/v1/admin/requests")) == []  # none open

    mine = _ok(lena.get("/v1/projects/nlp/requests"))
    assert len(mine) == 1 and mine[0]["status"] == "approved" and mine[0]["decided_by"] == "ada"
    assert Decimal(mine[0]["gpu_hours"]) == 400 and Decimal(mine[0]["granted_gpu_hours"]) == 250
    assert mine[0]["comment"] == "250 now, more in January"
    history = [(e["type"], e["actor"]) for e in _ok(lena.get("/v1/projects/nlp/history"))]
    assert history[-3:] == [
        ("AllocationRequested", "lena"),
        ("AllocationAdjusted", "ada"),
        ("AllocationRequestDecided", "ada"),
    ]
    # the plan file is behind now: applying it would take the 250 back, and its diff says so
    diff = _ok(ada.post("/v1/admin/plan/diff", json={"text": plan_text(IDP_PLAN)}))["changes"]
    assert [(c["action"], c["target"]) for c in diff] == [("adjust", "allocation nlp/2026-Q4")], diff

    # a decision stands: approving again is a retry, denying now a conflict
    approval = {"decision": "approve", "gpu_hours": "250", "comment": "250 now, more in January"}
    again = ada.post(f"/v1/admin/requests/{request_id}/decision", json=approval)
    assert _ok(again)["applied"] == [] and len(_ok(again)["unchanged"]) == 2
    late = ada.post(f"/v1/admin/requests/{request_id}/decision", json={"decision": "deny"})
    assert late.status_code == 409 and "approved by ada" in late.text
    assert _allocated(lena, "nlp") == before + 250


def test_an_extension_and_a_time_slice_are_granted_or_denied(keycloak: Keycloak, idp_api: IdpApi) -> None:
    viktor, ada = _as(idp_api, keycloak, "viktor"), _as(idp_api, keycloak, "ada")
    allocation = _ok(viktor.get("/v1/projects/vision/balance"))["allocations"][0]
    end = allocation["end"]
    extension = _ok(viktor.post("/v1/projects/vision/requests", json={
        "kind": "extension", "allocation_id": allocation["allocation_id"],
        "extend_to": "2027-01-31T00:00:00Z", "reason": "the cluster was down for a week",
    }))["applied"][0]["data"]["request_id"]  # fmt: skip
    window = {"kind": "fixed", "start": 1_798_761_600 - 86_400 * 3, "end": 1_798_761_600 - 86_400 * 2}
    slot = _ok(viktor.post("/v1/projects/vision/requests", json={
        "kind": "time-slice", "cluster": "h100-a", "gpus": 16, "window": window, "reason": "the CVPR sweep",
    }))["applied"][0]["data"]["request_id"]  # fmt: skip
    # an extension has no amount to change
    wrong = ada.post(
        f"/v1/admin/requests/{extension}/decision", json={"decision": "approve", "gpu_hours": "5"}
    )
    assert wrong.status_code == 422
    _ok(ada.post(f"/v1/admin/requests/{extension}/decision", json={"decision": "approve"}))
    _ok(ada.post(f"/v1/admin/requests/{slot}/decision", json={"decision": "deny", "comment": "overbooked"}))

    after = _ok(viktor.get("/v1/projects/vision/balance"))["allocations"][0]
    assert end < after["end"] == 1_801_353_600  # 2027-01-31T00:00:00Z
    statuses = {
        r["request_id"]: (r["status"], r["comment"]) for r in _ok(viktor.get("/v1/projects/vision/requests"))
    }
    assert statuses == {extension: ("approved", ""), slot: ("denied", "overbooked")}
    timeslices = _ok(viktor.get("/v1/dashboard/projects/vision/timeslices"))
    assert not any(slot in str(t) for t in timeslices.get("agreements", []))


def test_a_request_without_its_fields_or_reason_is_422(keycloak: Keycloak, idp_api: IdpApi) -> None:
    lena = _as(idp_api, keycloak, "lena")
    for body in (
        {"kind": "gpu-hours", "reason": "no amount"},
        {"kind": "gpu-hours", "gpu_hours": "10", "reason": ""},
        {"kind": "extension", "allocation_id": "nope", "extend_to": "2027-01-01T00:00:00Z", "reason": "x"},
        {"kind": "time-slice", "cluster": "h100-a", "reason": "no gpus, no window"},
        {"kind": "gpu-hours", "gpu_hours": "10", "period": "2026-Q9", "reason": "x"},
    ):
        answer = lena.post("/v1/projects/nlp/requests", json=body)
        assert answer.status_code in (404, 422), (body, answer.text)
        assert answer.json()["detail"], body
