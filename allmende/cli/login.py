"""`allmende login`: an access token of the organisation's identity provider for the CLI (docs/auth.md).

A person signs in with the OAuth 2.0 device authorization grant (RFC 8628): the CLI shows a URL
and a code, the person approves in any browser, the CLI polls the token endpoint (Authlib's
client) until it is approved, denied or expired. A script uses the client credentials grant of its
own client (`--client-credentials`). The token is kept in `<state dir>/oidc-token.json` (0600) and
sent as Bearer by every later command, refreshed with its refresh token once it has expired;
`ALLMENDE_TOKEN` still wins. `allmende logout` forgets it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from authlib.integrations.base_client import OAuthError
from authlib.integrations.httpx_client import OAuth2Client
from rich.console import Console

from allmende.core.settings import Settings
from allmende.services.api.auth import TokenRejected
from allmende.services.api.oidc import IdentityProvider, Provider

DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
EARLY_S = 30  # refresh a token this long before it expires
console = Console()


def token_file(settings: Settings) -> Path:
    return settings.state_dir / "oidc-token.json"


def _provider(settings: Settings) -> Provider:
    """The issuer's endpoints, from its discovery document (the API's own reader of it)."""
    if not settings.oidc_issuer:
        console.print("[red]no identity provider: set ALLMENDE_OIDC_ISSUER (docs/auth.md)[/red]")
        raise typer.Exit(2)
    try:
        return IdentityProvider(settings).provider()
    except TokenRejected as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None


def _client(settings: Settings) -> OAuth2Client:
    return OAuth2Client(
        client_id=settings.oidc_cli_client_id,
        client_secret=settings.oidc_cli_client_secret or None,
        token_endpoint_auth_method="client_secret_basic" if settings.oidc_cli_client_secret else "none",
        timeout=10,
    )


def _keep(settings: Settings, token: dict[str, Any], grant: str) -> None:
    path = token_file(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.chmod(0o600)
    kept = {k: token[k] for k in ("access_token", "refresh_token", "expires_at") if k in token}
    path.write_text(json.dumps({**kept, "grant": grant}))


def stored_token(settings: Settings) -> str | None:
    """The kept access token, renewed once it has expired (its refresh token; a script's client
    credentials again); None when nobody signed in. A sign-in that cannot be renewed ends the
    command: never a quiet fall-back to another identity."""
    path = token_file(settings)
    if not settings.oidc_issuer or not path.exists():
        return None
    try:
        token = json.loads(path.read_text())
    except ValueError:
        token = {}
    if float(token.get("expires_at", 0)) - EARLY_S > time.time():
        return str(token["access_token"])
    grant = str(token.get("grant", "device"))
    try:
        with _client(settings) as client:
            endpoint = _provider(settings).token_endpoint
            if grant == "client_credentials":
                fresh = client.fetch_token(endpoint, grant_type="client_credentials")
            elif token.get("refresh_token"):
                fresh = client.refresh_token(endpoint, token["refresh_token"])
            else:
                raise OAuthError("expired", "the token expired and has no refresh token")
    except (OAuthError, httpx.HTTPError) as exc:
        console.print(f"[red]the identity provider's sign-in has ended ({exc}): run allmende login[/red]")
        raise typer.Exit(1) from None
    _keep(settings, dict(fresh), grant)
    return str(fresh["access_token"])


def login(
    client_credentials: Annotated[
        bool, typer.Option("--client-credentials", help="a script's own client (ALLMENDE_OIDC_CLI_CLIENT_*)")
    ] = False,
) -> None:
    """Sign in with the organisation's identity provider; later commands send its token."""
    settings = Settings()
    provider = _provider(settings)
    with _client(settings) as client:
        try:
            if client_credentials:
                token = client.fetch_token(provider.token_endpoint, grant_type="client_credentials")
            else:
                token = _device_flow(client, provider)
        except OAuthError as exc:
            console.print(f"[red]the identity provider refused: {exc.error}: {exc.description or ''}[/red]")
            raise typer.Exit(1) from None
    _keep(settings, dict(token), "client_credentials" if client_credentials else "device")
    console.print(f"signed in; the token is kept in {token_file(settings)}")


def _device_flow(client: OAuth2Client, provider: Provider) -> dict[str, Any]:
    endpoint = provider.device_authorization_endpoint
    if not endpoint:
        console.print("[red]the identity provider offers no device authorization grant[/red]")
        raise typer.Exit(2)
    form = {"client_id": client.client_id, "scope": "openid"}
    if client.client_secret:  # a confidential client authenticates here too
        form["client_secret"] = client.client_secret
    # A plain form POST (RFC 8628 3.1): Authlib's client would attach a token it does not have yet.
    started = httpx.post(endpoint, data=form, timeout=10)
    if started.status_code != 200:
        console.print(f"[red]the identity provider refused the sign-in: {started.text[:300]}[/red]")
        raise typer.Exit(1)
    grant = started.json()
    url = grant.get("verification_uri_complete") or grant["verification_uri"]
    console.print(f"Open {url} in a browser and approve the code {grant['user_code']}.", soft_wrap=True)
    deadline = time.monotonic() + float(grant.get("expires_in", 600))
    interval = float(grant.get("interval", 5))
    while time.monotonic() < deadline:
        time.sleep(interval)
        try:
            return dict(client.fetch_token(provider.token_endpoint, grant_type=DEVICE_GRANT,
                                           device_code=grant["device_code"]))  # fmt: skip
        except OAuthError as exc:
            if exc.error == "authorization_pending":
                continue
            if exc.error == "slow_down":
                interval += 5
                continue
            raise
    console.print("[red]the code expired before it was approved: run allmende login again[/red]")
    raise typer.Exit(1)


def logout() -> None:
    """Forget the identity provider's token (the IdP's own session is the browser's)."""
    path = token_file(Settings())
    path.unlink(missing_ok=True)
    console.print("signed out")
