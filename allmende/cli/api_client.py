"""How the command line talks to the API: its URL, the caller's token, and errors people can read."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

import httpx
import typer
from rich.console import Console

from allmende.core.settings import Settings

console = Console()


def api_url(settings: Settings) -> str:
    return os.environ.get("ALLMENDE_API_URL", f"http://{settings.api_host}:{settings.api_port}")


def local_admin_token_file(settings: Settings) -> Path:
    return settings.run_dir.parent / "admin-token"


def local_admin_token(settings: Settings, create: bool = False) -> str | None:
    """The token `allmende up` gives the local API (0600 file beside the data), made on first use."""
    path = local_admin_token_file(settings)
    if path.exists():
        return path.read_text().strip()
    if not create:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    path.touch(mode=0o600)
    path.write_text(token)
    return token


def token_for(settings: Settings) -> str | None:
    """ALLMENDE_TOKEN, else the identity provider's (`allmende login`), else the local admin's."""
    from allmende.cli.login import stored_token  # Authlib only where a sign-in is used

    return settings.token or stored_token(settings) or local_admin_token(settings)


def call(settings: Settings, method: str, path: str, **kwargs: Any) -> Any:
    """One API call; on failure print the API's own words (and a plan's problems) and exit 1."""
    headers = dict(kwargs.pop("headers", {}))
    if (token := token_for(settings)) is not None:
        headers["Authorization"] = f"Bearer {token}"
    url = api_url(settings)
    try:
        response = httpx.request(method, f"{url}{path}", headers=headers, timeout=60, **kwargs)
    except httpx.HTTPError as exc:
        console.print(f"[red]cannot reach the API at {url}: {exc}[/red]")
        raise typer.Exit(2) from None
    if response.status_code >= 400:
        try:
            body = response.json()
        except ValueError:
            body = {"detail": response.text}
        detail = body.get("detail", body) if isinstance(body, dict) else body
        console.print(f"[red]{response.status_code}: {detail}[/red]")
        for problem in body.get("problems", []) if isinstance(body, dict) else []:
            where = f"line {problem['line']}" if problem.get("line") else "file"
            console.print(f"  {where}: [bold]{problem['field']}[/bold]: {problem['message']}")
        raise typer.Exit(1)
    return response.json()
