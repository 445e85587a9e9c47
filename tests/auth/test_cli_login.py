"""`allmende login` against the real Keycloak: the device flow approved in headless Chromium by a
lead, the client credentials grant for a script; later commands send the token (allmende/cli/login.py)."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

from playwright.sync_api import Browser

from allmende.testing.keycloak import CLI_CLIENT_ID, CLI_CLIENT_SECRET, PASSWORDS, Keycloak
from tests.auth.conftest import IdpApi
from tests.browser.conftest import VIEWPORT


def cli_env(keycloak: Keycloak, api: IdpApi, state: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALLMENDE_")}
    return env | {
        "ALLMENDE_OIDC_ISSUER": keycloak.issuer,
        "ALLMENDE_OIDC_CLI_CLIENT_ID": CLI_CLIENT_ID,
        "ALLMENDE_OIDC_CLI_CLIENT_SECRET": CLI_CLIENT_SECRET,
        "ALLMENDE_API_URL": api.url,
        "ALLMENDE_STATE_DIR": str(state),
        "ALLMENDE_LOG_JSON": "false",
    }


def allmende(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "allmende", *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_a_lead_signs_the_cli_in_with_the_device_flow(
    browser: Browser, keycloak: Keycloak, idp_api: IdpApi, tmp_path: Path
) -> None:
    env = cli_env(keycloak, idp_api, tmp_path / "state")
    assert allmende(env, "budget", "balance", "nlp").returncode != 0  # nobody signed in yet
    login = subprocess.Popen(
        [sys.executable, "-m", "allmende", "login"], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert login.stdout is not None
        line = ""
        while "Open " not in line:
            more = login.stdout.readline()
            assert more, f"allmende login ended: {login.wait(timeout=10)}; {line}"
            line += more
        url = re.search(r"Open (\S+) in a browser", line.replace("\n", ""))
        assert url, line
        context = browser.new_context(viewport=VIEWPORT)  # type: ignore[arg-type]
        page = context.new_page()
        page.goto(url.group(1))
        page.fill("#username", "lena")
        page.fill("#password", PASSWORDS["lena"])
        page.click("#kc-login")
        page.wait_for_load_state("networkidle")
        # Keycloak asks the person to grant the CLI access (the device grant's consent)
        page.click("button[name=accept]")
        page.wait_for_load_state("networkidle")
        assert login.wait(timeout=60) == 0
        context.close()
    finally:
        login.kill()
    kept = tmp_path / "state" / "oidc-token.json"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600

    own = allmende(env, "budget", "balance", "nlp", "--json")
    assert own.returncode == 0, own.stdout + own.stderr
    assert '"project": "nlp"' in own.stdout
    other = allmende(env, "budget", "balance", "vision")
    assert other.returncode == 1 and "lena does not lead vision" in other.stdout
    assert allmende(env, "logout").returncode == 0 and not kept.exists()


def test_a_script_signs_in_with_client_credentials(
    keycloak: Keycloak, idp_api: IdpApi, tmp_path: Path
) -> None:
    env = cli_env(keycloak, idp_api, tmp_path / "state")
    signed = allmende(env, "login", "--client-credentials")
    assert signed.returncode == 0, signed.stdout + signed.stderr
    # the client's service account has no group: a valid token of nobody the API serves
    refused = allmende(env, "budget", "balance", "nlp")
    assert refused.returncode == 1 and "403" in refused.stdout
    wrong = allmende(
        env | {"ALLMENDE_OIDC_CLI_CLIENT_SECRET": "not-the-secret"}, "login", "--client-credentials"
    )
    assert wrong.returncode == 1 and "refused" in wrong.stdout
