"""Signing in to the pages through a real Keycloak's own login form, in headless Chromium: the
authorization code flow with PKCE, roles from the realm's groups, sign-out at both ends
(services/web/oidc_signin.py, docs/auth.md)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Browser, BrowserContext, Page

from allmende.services.api.auth import SESSION_COOKIE
from allmende.testing.keycloak import PASSWORDS, Keycloak
from tests.auth.conftest import IdpApi
from tests.browser.conftest import VIEWPORT


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    fresh = browser.new_context(viewport=VIEWPORT)  # type: ignore[arg-type]
    yield fresh
    fresh.close()


def sign_in(context: BrowserContext, api: IdpApi, keycloak: Keycloak, user: str) -> Page:
    """Through the sign-in page's button and Keycloak's login form; the page where it ends."""
    page = context.new_page()
    page.goto(f"{api.url}/ui")
    assert page.url.endswith("/ui/signin")
    page.click("#idp-signin")
    page.wait_for_url(f"{keycloak.issuer}/**")  # Keycloak's own form, not ours
    page.fill("#username", user)
    page.fill("#password", PASSWORDS[user])
    page.click("#kc-login")
    page.wait_for_load_state("networkidle")
    return page


def session_cookie(context: BrowserContext) -> str:
    return next(c["value"] for c in context.cookies() if c["name"] == SESSION_COOKIE)


def test_a_lead_signs_in_through_keycloak_and_reads_only_their_projects(
    context: BrowserContext, idp_api: IdpApi, keycloak: Keycloak
) -> None:
    page = sign_in(context, idp_api, keycloak, "lena")
    page.wait_for_url(f"{idp_api.url}/ui/projects/nlp**")  # her one project's page
    assert "lena" in page.inner_text("header .who") and "(lead)" in page.inner_text("header .who")
    own = page.request.get(f"{idp_api.url}/v1/projects/nlp/balance")
    other = page.request.get(f"{idp_api.url}/v1/projects/vision/balance")
    assert own.status == 200 and other.status == 403
    assert page.goto(f"{idp_api.url}/ui/projects/vision").status == 403  # type: ignore[union-attr]
    cookie = next(c for c in context.cookies() if c["name"] == SESSION_COOKIE)
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"


def test_an_admin_sees_the_overview(context: BrowserContext, idp_api: IdpApi, keycloak: Keycloak) -> None:
    page = sign_in(context, idp_api, keycloak, "ada")
    page.wait_for_url(f"{idp_api.url}/ui/overview**")
    assert "(admin)" in page.inner_text("header .who")
    assert page.request.get(f"{idp_api.url}/v1/admin/disputes").status == 200


def test_someone_with_no_role_gets_a_refusal_page_and_no_session(
    context: BrowserContext, idp_api: IdpApi, keycloak: Keycloak
) -> None:
    page = sign_in(context, idp_api, keycloak, "nils")
    assert page.url.startswith(f"{idp_api.url}/auth/callback")
    refusal = page.inner_text("[role=alert]")
    assert "nils" in refusal and "neither an admin nor a project lead" in refusal
    assert not [c for c in context.cookies() if c["name"] == SESSION_COOKIE]
    assert page.goto(f"{idp_api.url}/ui").url.endswith("/ui/signin")  # type: ignore[union-attr]


def test_sign_out_ends_the_session_here_and_at_keycloak(
    context: BrowserContext, idp_api: IdpApi, keycloak: Keycloak
) -> None:
    page = sign_in(context, idp_api, keycloak, "viktor")
    page.wait_for_url(f"{idp_api.url}/ui/projects/vision**")
    stolen = session_cookie(context)
    page.click("text=Sign out")
    page.wait_for_url(f"{idp_api.url}/ui/signin**")
    # the session id is worthless now, wherever a copy of it went
    url = f"{idp_api.url}/v1/projects/vision/balance"
    answer = httpx.get(url, cookies={SESSION_COOKIE: stolen}, timeout=30)
    assert answer.status_code == 401
    # and Keycloak's own session ended too: signing in again asks for the password again
    page.click("#idp-signin")
    page.wait_for_url(f"{keycloak.issuer}/**")
    assert page.is_visible("#password")


def test_a_callback_not_started_in_this_browser_is_refused(context: BrowserContext, idp_api: IdpApi) -> None:
    page = context.new_page()
    answer = page.goto(f"{idp_api.url}/auth/callback?state=forged&code=stolen")
    assert answer is not None and answer.status == 400
    assert "started elsewhere" in page.content()


def test_a_lead_asks_on_the_project_page_and_an_admin_decides_on_the_overview(
    browser: Browser, idp_api: IdpApi, keycloak: Keycloak
) -> None:
    lead, admin = (browser.new_context(viewport=VIEWPORT) for _ in range(2))  # type: ignore[arg-type]
    try:
        page = sign_in(lead, idp_api, keycloak, "lena")
        page.wait_for_url(f"{idp_api.url}/ui/projects/nlp**")
        page.wait_for_function("document.body.dataset.ready === 'true'", timeout=30_000)
        form = page.locator("#request-form")
        form.locator("[name=gpu_hours]").fill("120")
        form.locator("[name=period]").fill("2026-Q4")
        form.locator("[name=reason]").fill("tokenizer sweep")
        form.locator("button[type=submit]").click()
        page.wait_for_selector("#request-status.ok")
        row = page.locator("#requests tbody tr").filter(has_text="tokenizer sweep")
        assert "open" in row.inner_text()

        desk = sign_in(admin, idp_api, keycloak, "ada")
        desk.wait_for_url(f"{idp_api.url}/ui/overview**")
        desk.wait_for_function("document.body.dataset.ready === 'true'", timeout=30_000)
        pending = desk.locator("#open-requests tbody tr").filter(has_text="tokenizer sweep")
        pending.locator("[name=gpu_hours]").fill("80")
        pending.locator("[name=comment]").fill("80 for now")
        pending.locator("button[data-decision=approve]").click()
        rows = "[...document.querySelectorAll('#open-requests tbody tr')]"
        desk.wait_for_function(f"!{rows}.some(r => r.innerText.includes('tokenizer sweep'))")

        page.reload()
        page.wait_for_function("document.body.dataset.ready === 'true'", timeout=30_000)
        decided = page.locator("#requests tbody tr").filter(has_text="tokenizer sweep").inner_text()
        assert (
            "approved" in decided
            and "ada" in decided
            and "granted 80.0" in decided
            and "80 for now" in decided
        )
    finally:
        lead.close()
        admin.close()
