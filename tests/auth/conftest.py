"""A real Keycloak for the sign-in tests: one per session, the realm of
infra/keycloak/realm-allmende.json imported (allmende.testing.keycloak)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from playwright.sync_api import Browser, sync_playwright

from allmende.core.settings import Settings
from allmende.testing.budget_harness import ADMIN, live_api, ok, plan_text
from allmende.testing.keycloak import DIST, PAGES_CLIENT_ID, PAGES_CLIENT_SECRET, Keycloak, running_keycloak
from allmende.testing.tagged_settings import tagged_settings
from tests.browser.conftest import CHROMIUM_ARGS, chromium_path


@pytest.fixture(scope="session")
def keycloak(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keycloak]:
    if not (DIST / "bin" / "kc.sh").is_file():
        pytest.fail(f"no Keycloak distribution at {DIST}: run `make keycloak` first", pytrace=False)
    with running_keycloak(tmp_path_factory.mktemp("keycloak")) as server:
        print(f"\nKeycloak ready in {server.startup_seconds:.1f}s (log: {server.log_file})")  # with -s
        yield server


# The API signing people in through that Keycloak (docs/auth.md), with a plan whose projects the
# realm's lead groups name: /leads/nlp (lena), /leads/vision (viktor).
IDP_PLAN = """
plan: idp-2026-q4
period: 2026-Q4
clusters:
  - {name: h100-a, gpu_type: H100, gpus: 64}
organisation:
  - {id: institute, kind: organisation, shares: 100}
  - {id: nlp, parent: institute, kind: project, shares: 60}
  - {id: vision, parent: institute, kind: project, shares: 40}
policy:
  id: prices
  gpu_type_weights: {H100: 1.00}
  priority_multipliers: {preemptible: 0.50, standard: 1.00, non-preemptible: 2.00}
  interactive_rate: 1.25
allocations:
  - {project: nlp, gpu_hours: 1000}
  - {project: vision, gpu_hours: 500}
"""


@dataclass
class IdpApi:
    url: str
    settings: Settings
    clock_skew_s: int


@pytest.fixture(scope="module")
def idp_api(
    keycloak: Keycloak, kafka_bootstrap: str, chdb_dsn: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[IdpApi]:
    settings = tagged_settings(kafka_bootstrap, chdb_dsn, tmp_path_factory.mktemp("idp-api"), prefix="i")
    settings = settings.model_copy(
        update={
            "oidc_issuer": keycloak.issuer,
            "oidc_client_id": PAGES_CLIENT_ID,
            "oidc_client_secret": PAGES_CLIENT_SECRET,
            "oidc_clock_skew_s": 1,  # the expiry test waits this long past a token's end
        }
    )
    with live_api(settings, int(time.time())) as (url, _clock):
        plan = {"text": plan_text(IDP_PLAN)}
        ok(httpx.post(f"{url}/v1/admin/plan/apply", json=plan, headers=ADMIN, timeout=60))
        yield IdpApi(url, settings, settings.oidc_clock_skew_s)


# Module scope: the sync API keeps an event loop in the main thread while it runs (tests/browser).
@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS)
        yield launched
        launched.close()
