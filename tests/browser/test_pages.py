"""The dashboard pages in headless Chromium on the real platform (a replayed ElasticFlow slice):
they load cleanly, their charts hold the numbers of the JSON routes, a lead sees only their own
projects, the CSV links give the JSON's rows, and the session cookie is HttpOnly and Strict."""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from playwright.sync_api import BrowserContext

from allmende.testing.platform_harness import ADMIN_TOKEN, ALICE_TOKEN, BOB_TOKEN, Platform
from tests.browser.conftest import Visit, open_page

pytestmark = pytest.mark.integration
SignIn = Callable[[str], BrowserContext]
DAY_MS = 86_400_000


def _ms(iso: str) -> int:
    return int(dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


def _day_end_ms(day: str) -> int:
    return _ms(f"{day}T00:00:00Z") + DAY_MS


def _series(visit: Visit, chart: str) -> list[dict[str, Any]]:
    series: list[dict[str, Any]] = visit.page.evaluate(
        "name => window.allmendeCharts[name].getOption().series.map(s => ({name: s.name, data: s.data}))",
        chart,
    )
    return series


def _axis(visit: Visit, chart: str, axis: str) -> list[Any]:
    data: list[Any] = visit.page.evaluate(
        "([name, axis]) => window.allmendeCharts[name].getOption()[axis][0].data", [chart, axis]
    )
    return data


def _num(s: str | None) -> float | None:
    return None if s is None else float(s)


def _cells(rows: list[dict[str, Any]]) -> list[dict[str, str]]:
    def cell(v: Any) -> str:
        return "" if v is None else ("true" if v is True else "false" if v is False else str(v))

    return [{k: cell(v) for k, v in row.items()} for row in rows]


def test_both_pages_load_without_console_errors(platform: Platform, signed_in: SignIn) -> None:
    admin, alice = signed_in(ADMIN_TOKEN), signed_in(ALICE_TOKEN)
    visits = {
        "admin overview": open_page(admin, f"{platform.url}/ui/overview"),
        "admin ef-cluster10": open_page(admin, f"{platform.url}/ui/projects/ef-cluster10"),
        "admin ef-cluster01 in 2021-Q2": open_page(
            admin, f"{platform.url}/ui/projects/ef-cluster01?period=2021-Q2"
        ),
        "alice's home": open_page(alice, f"{platform.url}/ui"),
        "alice's overview": open_page(alice, f"{platform.url}/ui/overview"),
    }

    for name, visit in visits.items():
        assert visit.status == 200, name
        assert visit.errors == [], name
        assert visit.page.evaluate("document.body.dataset.error") is None, name
    assert visits["alice's home"].page.url.endswith("/ui/projects/ef-cluster01")
    # Refusals and over-capacity are the admins' cards: the demo plan holds its trace, nothing refused.
    overview = visits["admin overview"].page
    assert overview.locator("#over-capacity .empty").inner_text() == "No cluster ran more GPUs than it has."
    assert overview.locator("#refused .empty").inner_text() == "Nothing refused."
    assert overview.locator("#disputes .empty").inner_text() == "No disputed usage."
    assert visits["alice's overview"].page.locator("#refused, #over-capacity, #disputes").count() == 0
    project = visits["admin ef-cluster10"].page
    assert project.locator("#holds-note").is_visible()
    assert project.locator("#holds-note").inner_text() == "Holds count as spent for the forecast."
    assert project.locator("#squatting tbody tr").count() == 1  # the parked job
    assert project.locator("#timeslices tbody tr").count() > 0
    assert project.locator("#holds tbody tr").count() == 2  # the admitted jobs
    assert project.locator("#running tbody tr").count() == 2
    assert "Overran" in project.locator("#running thead").inner_text()
    assert project.locator("#period").input_value() == "2021-Q2"
    # Readable on a laptop: nothing wider than the 1366 px viewport.
    assert project.evaluate("document.documentElement.scrollWidth") <= 1366


def test_the_project_charts_hold_the_numbers_of_the_json(platform: Platform, signed_in: SignIn) -> None:
    visit = open_page(signed_in(ADMIN_TOKEN), f"{platform.url}/ui/projects/ef-cluster10")
    base = "/v1/dashboard/projects/ef-cluster10"
    burn = visit.json(f"{base}/burn")
    by = {
        key: visit.json(f"{base}/breakdown", by=key)
        for key in ("cluster", "gpu_type", "user", "priority_class")
    }

    cumulative, even, allocation, *forecasts = _series(visit, "burn")
    assert cumulative["data"] == [
        [_day_end_ms(r["day"]), float(r["cumulative_charged_gpu_hours"])] for r in burn["rows"]
    ]
    assert even["data"] == [[_day_end_ms(r["day"]), float(r["even_burn_gpu_hours"])] for r in burn["rows"]]
    alloc = float(burn["allocated_gpu_hours"])
    assert allocation["data"] == [[_ms(burn["period_start"]), alloc], [_ms(burn["period_end"]), alloc]]
    assert len(forecasts) == 2 == len(burn["forecasts"])
    spent = float(burn["charged_gpu_hours"]) + float(burn["held_gpu_hours"])
    for series, forecast in zip(forecasts, burn["forecasts"], strict=True):
        (x0, y0), (x1, y1) = series["data"]
        assert (x0, x1) == (_ms(burn["as_of"]), _ms(burn["period_end"]))
        assert y0 == pytest.approx(spent, abs=1e-4)
        assert y1 == float(forecast["projected_charged_gpu_hours_at_end"])
        days = (x1 - x0) / DAY_MS  # the line's slope is the forecast's rate
        assert (y1 - y0) / days == pytest.approx(
            float(forecast["charged_gpu_hours_per_day"]), rel=1e-3, abs=1e-3
        )
    assert cumulative["data"][-1][1] == float(burn["charged_gpu_hours"]) > 0

    (daily,) = _series(visit, "daily")
    assert daily["data"] == [[r["day"], float(r["charged_gpu_hours"])] for r in burn["rows"]]
    assert _axis(visit, "daily", "xAxis") == [r["day"] for r in burn["rows"]]

    for key, body in by.items():
        charged, idle = _series(visit, f"by_{key}")
        assert _axis(visit, f"by_{key}", "yAxis") == [r["key"] for r in body["rows"]], key
        assert charged["data"] == [float(r["charged_gpu_hours"]) for r in body["rows"]], key
        assert idle["data"] == [float(r["idle_gpu_hours"]) for r in body["rows"]], key
    assert {r["key"] for r in by["user"]["rows"]} == {"ef-cluster10", "squatter"}
    assert visit.errors == []


def test_the_overview_charts_and_tables_hold_the_numbers_of_the_json(
    platform: Platform, signed_in: SignIn
) -> None:
    visit = open_page(signed_in(ADMIN_TOKEN), f"{platform.url}/ui/overview")
    utilization = visit.json("/v1/dashboard/clusters/utilization")
    overview = visit.json("/v1/dashboard/overview")
    fairshare = visit.json("/v1/dashboard/fairshare")

    series = {s["name"]: s["data"] for s in _series(visit, "utilization")}
    clusters = sorted({r["cluster"] for r in utilization["rows"]})
    assert clusters == ["ef-cluster01", "ef-cluster10"]
    assert set(series) == {f"{c} {what}" for c in clusters for what in ("used", "capacity")}
    for c in clusters:
        rows = [r for r in utilization["rows"] if r["cluster"] == c]
        assert series[f"{c} used"] == [[r["day"], float(r["used_gpu_hours"])] for r in rows]
        assert series[f"{c} capacity"] == [[r["day"], float(r["capacity_gpu_hours"])] for r in rows]
    assert sum(float(r["used_gpu_hours"]) for r in utilization["rows"]) > 0

    table = visit.page.locator("#projects tbody tr")
    assert [table.nth(i).locator("td").first.inner_text() for i in range(table.count())] == [
        r["project"] for r in overview["rows"]
    ]
    nodes = visit.page.locator("#fairshare tbody tr td:first-child")
    assert [n.strip() for n in nodes.all_inner_texts()] == [r["node_id"] for r in fairshare["rows"]]
    # Sorting: a click on "Charged" puts the largest charge first, a second click last.
    charged = sorted(overview["rows"], key=lambda r: float(r["charged_gpu_hours"]))
    header = visit.page.locator("#projects th[data-key=charged_gpu_hours]")
    header.click()
    assert visit.page.locator("#projects tbody tr td:first-child").all_inner_texts() == [
        r["project"] for r in reversed(charged)
    ]
    header.click()
    assert visit.page.locator("#projects tbody tr td:first-child").all_inner_texts() == [
        r["project"] for r in charged
    ]
    assert visit.errors == []


def test_a_lead_sees_only_their_own_projects_and_is_refused_another(
    platform: Platform, signed_in: SignIn
) -> None:
    for token, own, other, name in [
        (ALICE_TOKEN, "ef-cluster01", "ef-cluster10", "alice"),
        (BOB_TOKEN, "ef-cluster10", "ef-cluster01", "bob"),
    ]:
        context = signed_in(token)
        overview = open_page(context, f"{platform.url}/ui/overview")
        projects = overview.page.locator("#projects tbody tr td:first-child").all_inner_texts()
        assert projects == [own], name
        page = open_page(context, f"{platform.url}/ui/projects/{own}")
        assert page.page.locator("#project option").all_inner_texts() == [own], name
        assert page.json("/v1/dashboard/projects")["rows"] == [{"project": own}]

        refused = open_page(context, f"{platform.url}/ui/projects/{other}", wait_ready=False)
        assert refused.status == 403, name
        assert f"{other} is not {name}'s project" in refused.page.locator(".sentence").inner_text()
        assert refused.page.request.get(f"{platform.url}/v1/dashboard/projects/{other}/burn").status == 403
        assert open_page(context, f"{platform.url}/ui/projects/sandbox", wait_ready=False).status == 403
        assert overview.errors == [] and page.errors == [], name


def test_every_csv_link_gives_the_rows_of_its_json(platform: Platform, signed_in: SignIn) -> None:
    context = signed_in(ADMIN_TOKEN)
    checked = 0
    for path in (
        "/ui/overview?period=2021-Q2",
        "/ui/projects/ef-cluster10",
        "/ui/projects/ef-cluster01?period=2021-Q2",
    ):
        visit = open_page(context, f"{platform.url}{path}")
        links = visit.page.locator("a.csv")
        hrefs = [links.nth(i).get_attribute("href") or "" for i in range(links.count())]
        assert hrefs and all("format=csv" in h for h in hrefs), hrefs
        for href in hrefs:
            url = urlsplit(href)
            params = {k: v[0] for k, v in parse_qs(url.query).items()}
            assert params.pop("format") == "csv"
            takes_period = not url.path.endswith(("/fairshare", "/running", "/holds"))
            assert params.get("period") == ("2021-Q2" if takes_period and "period=" in path else None), href
            response = visit.page.request.get(visit.url(href))
            assert response.status == 200, href
            assert response.headers["content-type"].startswith("text/csv")
            rows = list(csv.DictReader(io.StringIO(response.text())))
            assert rows == _cells(visit.json(url.path, **params)["rows"]), href
            checked += 1
    assert checked >= 20


def test_the_session_cookie_is_httponly_and_strict_and_signing_out_clears_it(
    platform: Platform, signed_in: SignIn, browser: Any
) -> None:
    context = signed_in(ADMIN_TOKEN)
    (cookie,) = context.cookies()
    assert cookie["name"] == "allmende_session"
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict" and cookie["path"] == "/"
    assert cookie["secure"] is False  # plain http here; https requests get Secure
    assert ADMIN_TOKEN not in cookie["value"]  # an opaque session id, never the token
    visit = open_page(context, f"{platform.url}/ui/overview")
    assert visit.page.evaluate("document.cookie") == ""  # HttpOnly: no script reads it
    assert ADMIN_TOKEN not in visit.page.url

    anonymous = browser.new_context()
    try:
        page = anonymous.new_page()
        for path in ("/ui", "/ui/overview", "/ui/projects/ef-cluster01"):
            page.goto(f"{platform.url}{path}")
            assert urlsplit(page.url).path == "/ui/signin", path
        page.fill("#token", "not-a-token")
        with page.expect_response(
            lambda r: r.url.endswith("/ui/signin") and r.request.method == "POST"
        ) as wrong:
            page.click("button[type=submit]")
        assert wrong.value.status == 401
        assert "not known" in page.locator(".error").inner_text()
        assert anonymous.cookies() == []
        page.fill("#token", "sched-secret")
        with page.expect_response(
            lambda r: r.url.endswith("/ui/signin") and r.request.method == "POST"
        ) as sched:
            page.click("button[type=submit]")
        assert sched.value.status == 401 and anonymous.cookies() == []
    finally:
        anonymous.close()

    visit.page.goto(f"{platform.url}/ui/signout")
    assert urlsplit(visit.page.url).path == "/ui/signin"
    assert context.cookies() == []
    visit.page.goto(f"{platform.url}/ui/overview")
    assert urlsplit(visit.page.url).path == "/ui/signin"
    # Sign-out ended the session on the server: the old cookie, put back, opens nothing.
    context.add_cookies([cookie])
    visit.page.goto(f"{platform.url}/ui/overview")
    assert urlsplit(visit.page.url).path == "/ui/signin"
    assert visit.page.request.get(f"{platform.url}/v1/dashboard/projects").status == 401
