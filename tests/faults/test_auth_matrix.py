"""The auth matrix: every route of the OpenAPI document and every page, for every kind of caller,
against the table of docs/security.md, on the real app (real broker and chDB).

The table is parsed from the document, so the document and the code cannot drift: a route missing
from the table, a row for a route that is gone, or an answer other than the table's fails. Beside
the statuses, what "filtered" means is checked on the answers (a lead's fair-share tree and
organisation, the scheduler's factors), and the session cookie and the identifier rules are
tried the way the issue found them broken.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from fastapi.testclient import TestClient

from allmende.core.settings import Settings
from allmende.services.web.oidc_signin import router as oidc_router
from allmende.services.web.routes import router as web_router
from allmende.testing.budget_harness import FakeClock, ok, plan_text, set_clock, with_tokens
from allmende.testing.harness import wait_until
from allmende.topology import create_app

pytestmark = pytest.mark.integration

SECURITY_DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"
NOW = 1_799_755_200  # Tuesday 2027-01-12 12:00 UTC, inside the plan's quarter
TOKENS = {"admin": "admin-secret", "alice": "alice-secret", "bob": "bob-secret", "scheduler": "sched-secret",
          "submitter": "submit-secret"}  # fmt: skip
CALLERS = ("anonymous", "wrong token", "own lead", "other lead", "scheduler", "submitter", "admin")
OWN = "olmo-ft"  # led by alice (through the group nlp); bob leads vision, in another branch

PLAN = plan_text("""
    plan: matrix-2027-q1
    period: 2027-Q1
    clusters:
      - {name: h100-a, gpu_type: H100, gpus: 64}
    organisation:
      - {id: institute, kind: organisation, shares: 100, leads: [dana]}
      - {id: nlp, parent: institute, kind: group, shares: 60, leads: [alice]}
      - {id: olmo-ft, parent: nlp, kind: project, shares: 10}
      - {id: olmo-eval, parent: nlp, kind: project, shares: 5}
      - {id: cv, parent: institute, kind: group, shares: 40}
      - {id: vision, parent: cv, kind: project, shares: 40, leads: [bob]}
    policy:
      id: prices
      gpu_type_weights: {H100: 1.00}
      priority_multipliers: {preemptible: 0.50, standard: 1.00, non-preemptible: 2.00}
    allocations:
      - {project: olmo-ft, gpu_hours: 1000}
      - {project: olmo-eval, gpu_hours: 10}
      - {project: vision, gpu_hours: 500}
    agreements:
      - id: olmo-nightly
        project: olmo-ft
        cluster: h100-a
        gpus: 8
        weekly: {days: [mon, tue, wed, thu, fri], start: "22:00", hours: 8, time_zone: Europe/Berlin}
      - id: vision-deadline
        project: vision
        cluster: h100-a
        gpus: 8
        fixed: {start: 2027-02-01T00:00:00Z, end: 2027-02-08}
""")
JOB = {"project": OWN, "user": "ada", "cluster": "h100-a", "gpu_type": "H100", "gpus": 1,
       "requested_hours": 1, "priority_class": "preemptible"}  # fmt: skip


# -- the table ----------------------------------------------------------------------------------


def documented_table() -> dict[str, dict[str, str]]:
    """`METHOD /path` -> caller -> expected outcome, from the table under "What each role may do"."""
    text = SECURITY_DOC.read_text()
    section = text.split("## What each role may do", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in rows[0].strip("|").split("|")]
    assert header == ["route", *CALLERS], header
    table: dict[str, dict[str, str]] = {}
    for line in rows[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        route = cells[0].strip("`")
        assert re.fullmatch(r"(GET|POST|PUT|PATCH|DELETE) /\S*", route), line
        assert route not in table, f"{route} is listed twice"
        assert all(c in ("yes", "filtered", "401", "403", "sign-in") for c in cells[1:]), line
        table[route] = dict(zip(CALLERS, cells[1:], strict=True))
    return table


def served_routes(app: Any) -> set[str]:
    """Every operation of the OpenAPI document, every page under /ui and the IdP sign-in's routes."""
    routes = {f"{method.upper()} {path}" for path, ops in app.openapi()["paths"].items() for method in ops}
    for route in [*web_router.routes, *oidc_router.routes]:
        path = getattr(route, "path", "")
        routes |= {f"{m} {path}" for m in getattr(route, "methods", ()) if m != "HEAD"}
    return routes


# -- the app and its callers --------------------------------------------------------------------


@dataclass
class World:
    client: TestClient
    allocations: dict[str, str] = field(default_factory=dict)  # project -> its Q1 allocation id
    job_id: str = "matrix-seeded"

    def session(self, token: str) -> str:
        """A fresh session of the sign-in form (each page request gets its own: sign-out ends it)."""
        answer = self.client.post("/ui/signin", data={"token": token})
        assert answer.status_code == 303, answer.text
        self.client.cookies.clear()
        cookie = answer.headers["set-cookie"]
        match = re.match(r"allmende_session=([^;]+);", cookie)
        assert match, cookie
        return match.group(1)


def _token(caller: str) -> str:
    return {
        "anonymous": "",
        "wrong token": "wrong-secret",
        "own lead": TOKENS["alice"],
        "other lead": TOKENS["bob"],
        "scheduler": TOKENS["scheduler"],
        "submitter": TOKENS["submitter"],
        "admin": TOKENS["admin"],
    }[caller]


def _credentials(world: World, caller: str, page: bool) -> dict[str, str]:
    """The headers a caller sends: the bearer token to the JSON routes; to the pages, the session
    cookie of a sign-in (a wrong caller sends a real token in the cookie, as the cookie once held
    it; the scheduler, who cannot sign in, its bearer token)."""
    token = _token(caller)
    if caller == "anonymous":
        return {}
    if not page or caller in ("scheduler", "submitter"):
        return {"Authorization": f"Bearer {token}"}
    if caller == "wrong token":
        return {"Cookie": f"allmende_session={TOKENS['admin']}"}
    return {"Cookie": f"allmende_session={world.session(token)}"}


Request = Callable[[World, str], dict[str, Any]]  # (world, caller) -> httpx request arguments


def _get(url: str, **params: Any) -> Request:
    return lambda _w, _c: {"method": "GET", "url": url, "params": params or None}


def _post(url: str | Callable[[World], str], body: Any = None, **params: Any) -> Request:
    def build(world: World, _caller: str) -> dict[str, Any]:
        target = url(world) if callable(url) else url
        payload = body(world) if callable(body) else body
        return {"method": "POST", "url": target, "json": payload, "params": params or None}

    return build


def _signin(_world: World, caller: str) -> dict[str, Any]:
    return {"method": "POST", "url": "/ui/signin", "data": {"token": _token(caller)}}


MULTIPLIERS = {"preemptible": "0.5", "standard": "1", "non-preemptible": "2"}
POLICY = {
    "policy_id": "matrix-prices",
    "effective_from": "2027-03-01T00:00:00Z",
    "priority_multipliers": MULTIPLIERS,
}
WINDOW = {"kind": "fixed", "start": NOW + 86_400, "end": NOW + 90_000}
HOST = {"cluster": "h100-a", "host": "gpu-001", "healthy": True}
CLUSTER = {"cluster": "h100-a", "gpu_type": "H100", "gpus": 64}
AGREEMENT = {
    "agreement_id": "matrix-fixed",
    "project": "olmo-eval",
    "cluster": "h100-a",
    "gpus": 1,
    "window": WINDOW,
}
DASHBOARD = "/v1/dashboard/projects/" + OWN

REQUESTS: dict[str, Request] = {
    "POST /v1/admission": _post("/v1/admission", {**JOB, "job_id": "matrix-asked"}, dry_run="true"),
    "GET /v1/admission/{job_id}": lambda w, _c: {"method": "GET", "url": f"/v1/admission/{w.job_id}"},
    "POST /v1/preemption/plan": _post("/v1/preemption/plan", {"cluster": "h100-a", "gpus": 0}),
    "POST /v1/hosts/health": _post("/v1/hosts/health", HOST),
    "GET /v1/projects/{project}/usage": _get(f"/v1/projects/{OWN}/usage"),
    "GET /v1/projects": _get("/v1/projects"),
    "GET /v1/projects/{project}/balance": _get(f"/v1/projects/{OWN}/balance"),
    "GET /v1/projects/{project}/history": _get(f"/v1/projects/{OWN}/history"),
    "POST /v1/admin/nodes": _post("/v1/admin/nodes", {"node_id": OWN, "kind": "project", "parent": "nlp",
                                                      "shares": 10, "reason": "the same again"}),
    "POST /v1/admin/clusters": _post("/v1/admin/clusters", CLUSTER),
    "POST /v1/admin/policies": _post("/v1/admin/policies", POLICY),
    "POST /v1/admin/allocations": _post("/v1/admin/allocations",
                                        {"project": "olmo-eval", "period": "2027-Q2", "gpu_hours": "1"}),
    "POST /v1/admin/allocations/{allocation_id}/adjustments": _post(
        lambda w: f"/v1/admin/allocations/{w.allocations[OWN]}/adjustments",
        {"delta_gpu_hours": "1", "reason": "matrix"}),
    "POST /v1/admin/transfers": _post("/v1/admin/transfers", lambda w: {
        "from_allocation": w.allocations[OWN], "to_allocation": w.allocations["olmo-eval"], "gpu_hours": "1"
    }),
    "POST /v1/admin/agreements": _post("/v1/admin/agreements", AGREEMENT),
    "POST /v1/admin/agreements/{agreement_id}/revocation": _post(
        "/v1/admin/agreements/matrix-fixed/revocation", {"reason": "matrix"}),
    "POST /v1/admin/expiry": _post("/v1/admin/expiry"),
    "POST /v1/admin/plan/diff": _post("/v1/admin/plan/diff", {"text": PLAN}),
    "POST /v1/admin/plan/apply": _post("/v1/admin/plan/apply", {"text": PLAN}),
    "GET /v1/admin/organisation": _get("/v1/admin/organisation"),
    "GET /v1/admin/refused": _get("/v1/admin/refused"),
    "GET /v1/admin/over-capacity": _get("/v1/admin/over-capacity"),
    "GET /v1/admin/disputes": _get("/v1/admin/disputes"),
    "POST /v1/admin/disputes/{job_id}/resolution": _post(
        "/v1/admin/disputes/no-such-job/resolution", {"action": "charge"}),
    "POST /v1/projects/{project}/requests": _post(
        f"/v1/projects/{OWN}/requests", {"kind": "gpu-hours", "gpu_hours": "10", "reason": "matrix"}),
    "GET /v1/projects/{project}/requests": _get(f"/v1/projects/{OWN}/requests"),
    "GET /v1/admin/requests": _get("/v1/admin/requests"),
    "POST /v1/admin/requests/{request_id}/decision": _post(
        "/v1/admin/requests/no-such-request/decision", {"decision": "deny"}),
    "GET /auth/login": _get("/auth/login"),  # no IdP here: a page that says so
    "GET /auth/callback": _get("/auth/callback", state="forged", code="stolen"),
    "GET /v1/fairshare": _get("/v1/fairshare"),
    "GET /v1/dashboard/periods": _get("/v1/dashboard/periods"),
    "GET /v1/dashboard/projects": _get("/v1/dashboard/projects"),
    "GET /v1/dashboard/projects/{project}/burn": _get(f"{DASHBOARD}/burn"),
    "GET /v1/dashboard/projects/{project}/breakdown": _get(f"{DASHBOARD}/breakdown", by="cluster"),
    "GET /v1/dashboard/projects/{project}/running": _get(f"{DASHBOARD}/running"),
    "GET /v1/dashboard/projects/{project}/holds": _get(f"{DASHBOARD}/holds"),
    "GET /v1/dashboard/projects/{project}/preemptions": _get(f"{DASHBOARD}/preemptions"),
    "GET /v1/dashboard/projects/{project}/timeslices": _get(f"{DASHBOARD}/timeslices"),
    "GET /v1/dashboard/projects/{project}/squatting": _get(f"{DASHBOARD}/squatting"),
    "GET /v1/dashboard/overview": _get("/v1/dashboard/overview"),
    "GET /v1/dashboard/clusters/utilization": _get("/v1/dashboard/clusters/utilization"),
    "GET /v1/dashboard/fairshare": _get("/v1/dashboard/fairshare"),
    "GET /healthz": _get("/healthz"),
    "GET /ui": _get("/ui"),
    "GET /ui/overview": _get("/ui/overview"),
    "GET /ui/projects/{project}": _get(f"/ui/projects/{OWN}"),
    "GET /ui/signin": _get("/ui/signin"),
    "POST /ui/signin": _signin,
    "GET /ui/signout": _get("/ui/signout"),
    "POST /ui/signout": _post("/ui/signout"),
    "GET /ui/static/vendor/echarts.min.js": _get("/ui/static/vendor/echarts.min.js"),
    "GET /ui/static/{name}": _get("/ui/static/style.css"),
}  # fmt: skip


def outcome(response: httpx.Response) -> str:
    """What the table calls the answer: 401, 403, sign-in (a page's refusal) or yes."""
    status = response.status_code
    if status in (401, 403):
        return str(status)
    if status in (302, 303, 307) and urlsplit(response.headers["location"]).path == "/ui/signin":
        return "sign-in"
    assert status < 500, f"{status}: {response.text[:500]}"
    return "yes"


@pytest.fixture
def world(settings: Settings) -> Iterator[World]:
    s = with_tokens(settings).model_copy(update={"fairshare_publish_s": 0.2})
    with TestClient(create_app(s), follow_redirects=False) as client:
        set_clock(client.app, FakeClock(NOW))  # type: ignore[arg-type]
        admin = {"Authorization": f"Bearer {TOKENS['admin']}"}
        ok(client.post("/v1/admin/plan/apply", json={"text": PLAN}, headers=admin))
        found = World(client)
        for project in (OWN, "olmo-eval"):
            lines = ok(client.get(f"/v1/projects/{project}/balance", headers=admin))["allocations"]
            found.allocations[project] = lines[0]["allocation_id"]
        scheduler = {"Authorization": f"Bearer {TOKENS['scheduler']}"}
        ok(client.post("/v1/admission", json={**JOB, "job_id": found.job_id}, headers=scheduler))

        def tree_has_the_plan() -> bool:
            answer = client.get("/v1/fairshare", headers=admin)
            return answer.status_code == 200 and {"olmo-ft", "vision"} <= {
                n["node_id"] for n in answer.json()["nodes"]
            }

        wait_until(tree_has_the_plan, 60, "a fair-share snapshot of the plan's tree")
        yield found


# -- the matrix ---------------------------------------------------------------------------------


def test_the_security_doc_lists_every_route_and_page_once() -> None:
    from contextlib import asynccontextmanager

    from allmende.services.api.app import build_api

    @asynccontextmanager
    async def nothing(_: Any) -> Any:
        yield

    served, documented = served_routes(build_api(nothing)), set(documented_table())
    assert served - documented == set(), "routes the table of docs/security.md does not list"
    assert documented - served == set(), "rows of docs/security.md for routes that are gone"
    assert set(REQUESTS) == served, "the test sends no request to some route"


def test_every_route_and_page_answers_each_caller_as_the_security_doc_says(world: World) -> None:
    table = documented_table()
    assert set(table) == served_routes(world.client.app)
    mismatches: list[str] = []
    for route, expected in table.items():
        page = route.split(" ", 1)[1].startswith("/ui")
        for caller in CALLERS:
            request = REQUESTS[route](world, caller)
            headers = {} if route == "POST /ui/signin" else _credentials(world, caller, page)
            response = world.client.request(**request, headers=headers)
            world.client.cookies.clear()  # a Set-Cookie must not travel with the next caller
            want = "yes" if expected[caller] == "filtered" else expected[caller]
            got = outcome(response)
            if got != want:
                mismatches.append(f"{route} as {caller}: {got} ({response.status_code}), the doc says {want}")
    assert not mismatches, "\n".join(mismatches)


# -- what "filtered" shows ----------------------------------------------------------------------


def _as(world: World, who: str, url: str) -> Any:
    return ok(world.client.get(url, headers={"Authorization": f"Bearer {TOKENS[who]}"}))


def test_a_lead_reads_their_subtree_the_path_above_it_and_nothing_of_another_branch(world: World) -> None:
    usage = ("raw_usage", "norm_usage", "effective_usage", "level_fs")
    for who, own, path, other in (
        ("alice", {"nlp", "olmo-ft", "olmo-eval"}, {"institute", "root"}, {"cv", "vision"}),
        ("bob", {"vision"}, {"cv", "institute", "root"}, {"nlp", "olmo-ft", "olmo-eval"}),
    ):
        nodes = {n["node_id"]: n for n in _as(world, who, "/v1/fairshare")["nodes"]}
        assert set(nodes) == own | path, who
        for node_id in own:
            assert nodes[node_id]["detail"] == "own" and nodes[node_id]["factor"] is not None
            assert nodes[node_id]["raw_usage"] is not None and nodes[node_id]["norm_usage"] is None
        for node_id in path:  # ids and shares: no usage, no factor (they add up other branches')
            assert nodes[node_id]["detail"] == "path"
            assert all(nodes[node_id][f] is None for f in (*usage, "factor")), nodes[node_id]
        rows = _as(world, who, "/v1/dashboard/fairshare")["rows"]
        assert {r["node_id"] for r in rows} == own | path
        assert all(r["factor"] is None for r in rows if r["node_id"] in path)

        organisation = _as(world, who, "/v1/admin/organisation")
        shown = {n["node_id"]: n for n in organisation["nodes"]}
        assert set(shown) == own | (path - {"root"}) and not set(shown) & other, who
        assert all(shown[n]["leads"] is None for n in path - {"root"})  # other people's names
        assert all(shown[n]["leads"] is not None for n in own)
        agreements = {a["data"]["agreement_id"] for a in organisation["agreements"]}
        assert agreements == ({"olmo-nightly"} if who == "alice" else {"vision-deadline"})
        assert [c["cluster"] for c in organisation["clusters"]] == ["h100-a"]

    everything = _as(world, "admin", "/v1/fairshare")["nodes"]
    assert all(n["detail"] == "full" and n["raw_usage"] is not None for n in everything)
    organisation = _as(world, "admin", "/v1/admin/organisation")
    assert {n["node_id"] for n in organisation["nodes"]} == {"institute", "nlp", "olmo-ft", "olmo-eval", "cv",
                                                             "vision"}  # fmt: skip
    assert len(organisation["agreements"]) == 2


def test_the_scheduler_reads_the_projects_factors_and_nothing_of_the_organisation(world: World) -> None:
    nodes = _as(world, "scheduler", "/v1/fairshare")["nodes"]
    assert {n["node_id"] for n in nodes} == {"olmo-ft", "olmo-eval", "vision"}
    for node in nodes:  # what integrations/slurm/agent.py reads: node_id, is_leaf, factor
        assert node["is_leaf"] is True and isinstance(node["factor"], float) and node["detail"] == "factor"
        assert all(node[f] is None for f in ("raw_usage", "norm_usage", "effective_usage", "level_fs"))
    refused = world.client.get("/v1/admin/organisation", headers={"Authorization": "Bearer sched-secret"})
    assert refused.status_code == 403


# -- the session cookie -------------------------------------------------------------------------


def test_the_cookie_holds_an_opaque_session_that_sign_out_and_expiry_end(world: World) -> None:
    client = world.client
    session = world.session(TOKENS["alice"])
    assert TOKENS["alice"] not in session and len(session) >= 40
    cookie = {"Cookie": f"allmende_session={session}"}
    assert client.get("/v1/dashboard/projects", headers=cookie).json()["rows"] == [
        {"project": "olmo-eval"}, {"project": "olmo-ft"}
    ]  # fmt: skip
    assert client.get(f"/ui/projects/{OWN}", headers=cookie).status_code == 200

    # The token itself is no cookie any more (it was, before): refused like any unknown value.
    for raw in (TOKENS["alice"], TOKENS["admin"]):
        refused = client.get("/v1/dashboard/projects", headers={"Cookie": f"allmende_session={raw}"})
        assert refused.status_code == 401

    # Sign-out ends the session on the server: the same cookie, sent again, is worthless.
    out = client.post("/ui/signout", headers=cookie)
    client.cookies.clear()
    assert out.status_code == 303 and 'allmende_session=""' in out.headers["set-cookie"]
    assert client.get("/v1/dashboard/projects", headers=cookie).status_code == 401
    assert outcome(client.get(f"/ui/projects/{OWN}", headers=cookie)) == "sign-in"

    # Expiry: ALLMENDE_SESSION_TTL_S after sign-in (absolute); the cookie's Max-Age says as much.
    answer = client.post("/ui/signin", data={"token": TOKENS["admin"]})
    client.cookies.clear()
    assert f"Max-Age={8 * 3600}" in answer.headers["set-cookie"]
    assert "HttpOnly" in answer.headers["set-cookie"] and "SameSite=strict" in answer.headers["set-cookie"]
    admin = {"Cookie": answer.headers["set-cookie"].split(";", 1)[0]}
    sessions = client.app.state.tokens.sessions  # type: ignore[attr-defined]
    assert client.get("/v1/dashboard/overview", headers=admin).status_code == 200
    started = sessions.clock()
    sessions.clock = lambda: started + 8 * 3600 + 1
    assert client.get("/v1/dashboard/overview", headers=admin).status_code == 401
    assert outcome(client.get("/ui/overview", headers=admin)) == "sign-in"


# -- identifiers and sizes ----------------------------------------------------------------------


def test_a_plan_with_a_bad_id_or_size_is_refused_naming_line_and_field_and_changes_nothing(
    world: World,
) -> None:
    client, admin = world.client, {"Authorization": f"Bearer {TOKENS['admin']}"}
    before = ok(client.get("/v1/admin/organisation", headers=admin))
    projects = ok(client.get("/v1/dashboard/projects", headers=admin))
    grown = PLAN.replace(
        "  - {id: olmo-eval,", "  - {id: ../../etc, parent: nlp, kind: project}\n  - {id: olmo-eval,"
    ).replace("  - {project: vision, gpu_hours: 500}", "  - {project: vision, gpu_hours: 600}")
    line = next(i for i, text in enumerate(grown.splitlines(), 1) if "../../etc" in text)
    for route in ("/v1/admin/plan/diff", "/v1/admin/plan/apply"):
        refused = client.post(route, json={"text": grown}, headers=admin)
        assert refused.status_code == 422, refused.text
        body = refused.json()
        assert body["code"] == "plan-invalid"
        assert [(p["line"], p["field"]) for p in body["problems"]] == [(line, "organisation.3.id")]
        assert "'../../etc' is not a valid id" in body["detail"] and f"line {line}" in body["detail"]
    huge = PLAN.replace("gpus: 64}", "gpus: 1000000}")
    refused = client.post("/v1/admin/plan/apply", json={"text": huge}, headers=admin)
    assert refused.status_code == 422 and refused.json()["problems"][0]["field"] == "clusters.0.gpus"
    # Nothing of either plan took effect: not the good part of it (vision's 600 GPU-hours) either.
    assert ok(client.get("/v1/admin/organisation", headers=admin)) == before
    assert ok(client.get("/v1/dashboard/projects", headers=admin)) == projects
    balance = ok(client.get("/v1/projects/vision/balance", headers=admin))
    assert balance["allocations"][0]["allocated_gpu_hours"] == "500.000000000"

    # The admin API: the same rule for its bodies and path parameters.
    for body in (
        {"node_id": "../../etc", "kind": "project", "parent": "nlp"},
        {"node_id": "ok", "kind": "project", "parent": "nlp", "leads": ["a/b"]},
    ):
        assert client.post("/v1/admin/nodes", json=body, headers=admin).status_code == 422
    big = {"cluster": "h100-a", "gpu_type": "H100", "gpus": 1_000_000}
    assert client.post("/v1/admin/clusters", json=big, headers=admin).status_code == 422
    for bad in ("a..b", "a:b", "-x", "x" * 65):
        assert client.get(f"/v1/projects/{bad}/balance", headers=admin).status_code == 422, bad
        assert client.get(f"/ui/projects/{bad}", headers={"Cookie": _cookie(world)}).status_code == 404, bad
    assert ok(client.get("/v1/admin/organisation", headers=admin)) == before


def _cookie(world: World) -> str:
    return f"allmende_session={world.session(TOKENS['admin'])}"
