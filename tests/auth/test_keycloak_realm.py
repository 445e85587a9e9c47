"""The test realm as the sign-in feature will see it: discovery, the claims of user and client
tokens, refusals, and a rotated signing key."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
import secrets
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from allmende.testing.keycloak import (
    API_AUDIENCE,
    CLI_CLIENT_ID,
    CLI_CLIENT_SECRET,
    GROUPS,
    PAGES_CLIENT_ID,
    PAGES_CLIENT_SECRET,
    PASSWORDS,
    TEST_CLIENT_ID,
    Keycloak,
)

pytestmark = pytest.mark.integration


def _segment(token: str, index: int) -> dict[str, Any]:
    """A JWT's header (0) or payload (1), decoded without checking the signature."""
    part = token.split(".")[index]
    decoded: dict[str, Any] = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    return decoded


def claims(token: str) -> dict[str, Any]:
    return _segment(token, 1)


def audiences(payload: dict[str, Any]) -> list[str]:
    aud = payload.get("aud", [])
    return [aud] if isinstance(aud, str) else list(aud)


def test_discovery_names_the_issuer(keycloak: Keycloak) -> None:
    discovery = keycloak.discovery()
    assert discovery["issuer"] == keycloak.issuer
    assert discovery["jwks_uri"] == keycloak.jwks_url
    assert "S256" in discovery["code_challenge_methods_supported"]
    assert "urn:ietf:params:oauth:grant-type:device_code" in discovery["grant_types_supported"]


def test_a_leads_token_has_the_api_audience_and_the_lead_group(keycloak: Keycloak) -> None:
    response = keycloak.user_token("lena", PASSWORDS["lena"])
    access = claims(response["access_token"])
    assert access["iss"] == keycloak.issuer
    assert API_AUDIENCE in audiences(access)
    assert access["groups"] == ["/leads/nlp"]
    assert access["preferred_username"] == "lena"
    assert access["email"] == "lena@allmende.test"
    assert access["exp"] - access["iat"] == 300
    assert claims(response["id_token"])["groups"] == ["/leads/nlp"]


@pytest.mark.parametrize("username", ["ada", "viktor", "nils"])
def test_every_user_signs_in_with_the_groups_of_the_realm(keycloak: Keycloak, username: str) -> None:
    access = claims(keycloak.user_token(username, PASSWORDS[username])["access_token"])
    assert API_AUDIENCE in audiences(access)
    assert access.get("groups", []) == GROUPS[username]


def test_userinfo_has_the_groups(keycloak: Keycloak) -> None:
    token = keycloak.user_token("viktor", PASSWORDS["viktor"])["access_token"]
    userinfo = keycloak.http.get(
        keycloak.discovery()["userinfo_endpoint"], headers={"Authorization": f"Bearer {token}"}
    )
    assert userinfo.status_code == 200
    assert userinfo.json()["groups"] == ["/leads/vision"]


def test_a_wrong_password_is_refused(keycloak: Keycloak) -> None:
    # Keycloak answers a wrong user password with 400 invalid_grant (RFC 6749 5.2), a wrong
    # client secret with 401 unauthorized_client.
    with pytest.raises(httpx.HTTPStatusError) as refused:
        keycloak.user_token("lena", "not-lenas-password")
    assert refused.value.response.status_code == 400
    assert refused.value.response.json()["error"] == "invalid_grant"
    wrong_secret = keycloak.token_request(
        {"grant_type": "client_credentials", "client_id": CLI_CLIENT_ID, "client_secret": "wrong"}
    )
    assert wrong_secret.status_code == 401
    assert wrong_secret.json()["error"] == "unauthorized_client"


def test_the_cli_gets_a_client_credentials_token(keycloak: Keycloak) -> None:
    response = keycloak.client_credentials_token()
    access = claims(response["access_token"])
    assert response["token_type"].lower() == "bearer"
    assert access["azp"] == CLI_CLIENT_ID
    assert API_AUDIENCE in audiences(access)
    assert access["preferred_username"] == f"service-account-{CLI_CLIENT_ID}"
    assert "groups" not in access or access["groups"] == []


def test_the_cli_may_start_a_device_authorization(keycloak: Keycloak) -> None:
    started = keycloak.http.post(
        keycloak.discovery()["device_authorization_endpoint"],
        data={"client_id": CLI_CLIENT_ID, "client_secret": CLI_CLIENT_SECRET},
    )
    assert started.status_code == 200
    assert {"device_code", "user_code", "verification_uri"} <= started.json().keys()


def test_the_test_client_alone_has_the_password_grant(keycloak: Keycloak) -> None:
    for client_id in (CLI_CLIENT_ID, PAGES_CLIENT_ID):
        with pytest.raises(httpx.HTTPStatusError) as refused:
            keycloak.user_token("lena", PASSWORDS["lena"], client_id=client_id)
        assert refused.value.response.json()["error"] == "unauthorized_client"
    assert keycloak.user_token("lena", PASSWORDS["lena"], client_id=TEST_CLIENT_ID)["access_token"]


def test_a_rotated_signing_key_signs_the_new_tokens(keycloak: Keycloak) -> None:
    before = _segment(keycloak.user_token("ada", PASSWORDS["ada"])["access_token"], 0)["kid"]
    new_kid = keycloak.rotate_signing_key()
    after = _segment(keycloak.user_token("ada", PASSWORDS["ada"])["access_token"], 0)["kid"]
    assert after == new_kid != before
    kids = {key["kid"] for key in keycloak.jwks()["keys"]}
    assert {before, after} <= kids


def _sign_in_through_the_form(keycloak: Keycloak, username: str, redirect_uri: str) -> dict[str, Any]:
    """What the pages will do: authorization code with PKCE through Keycloak's own login form
    (posted as a browser would), then the code exchanged with the client secret."""
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    endpoints = keycloak.discovery()
    with httpx.Client(timeout=30.0) as browser:
        page = browser.get(
            endpoints["authorization_endpoint"],
            params={
                "client_id": PAGES_CLIENT_ID,
                "response_type": "code",
                "scope": "openid",
                "redirect_uri": redirect_uri,
                "state": "the-state",
                "code_challenge": challenge,
                "code_challenge_method": "S256",
            },
        )
        assert page.status_code == 200, page.text[:500]
        form = re.search(r'<form[^>]*id="kc-form-login"[^>]*action="([^"]+)"', page.text)
        assert form is not None, page.text[:500]
        # Keycloak's cookies are Secure: browsers send them to http://127.0.0.1 and localhost
        # (secure contexts), Python's cookie jar does not; so they are sent by hand here.
        cookies = "; ".join(f"{cookie.name}={cookie.value}" for cookie in browser.cookies.jar)
        answer = browser.post(
            html.unescape(form.group(1)),
            data={"username": username, "password": PASSWORDS[username]},
            headers={"Cookie": cookies},
        )
        # straight back to the pages: no required action (update profile, verify e-mail) in between
        assert answer.status_code == 302, answer.text[:500]
        location = answer.headers["location"]
        assert location.startswith(redirect_uri + "?")
        query = parse_qs(urlsplit(location).query)
        assert query["state"] == ["the-state"]
        exchanged = browser.post(
            endpoints["token_endpoint"],
            data={
                "grant_type": "authorization_code",
                "code": query["code"][0],
                "redirect_uri": redirect_uri,
                "code_verifier": verifier,
                "client_id": PAGES_CLIENT_ID,
                "client_secret": PAGES_CLIENT_SECRET,
            },
        )
        assert exchanged.status_code == 200, exchanged.text
        tokens: dict[str, Any] = exchanged.json()
        return tokens


@pytest.mark.parametrize(
    ("username", "redirect_uri"),
    [
        ("ada", "http://127.0.0.1:8765/auth/callback"),
        ("lena", "http://localhost:51234/auth/callback"),
        ("nils", "http://127.0.0.1:1234/auth/callback"),
    ],
)
def test_the_pages_sign_in_with_code_and_pkce_on_any_loopback_port(
    keycloak: Keycloak, username: str, redirect_uri: str
) -> None:
    tokens = _sign_in_through_the_form(keycloak, username, redirect_uri)
    access = claims(tokens["access_token"])
    assert access["azp"] == PAGES_CLIENT_ID
    assert API_AUDIENCE in audiences(access)
    assert access.get("groups", []) == GROUPS[username]
    assert claims(tokens["id_token"]).get("groups", []) == GROUPS[username]


@pytest.mark.parametrize(
    "redirect_uri",
    [
        "http://127.0.0.1:8765/other",
        "http://127.0.0.1:8765/auth/callback/more",
        "http://127.0.0.1.example.org/auth/callback",
        "http://example.org:8765/auth/callback",
    ],
)
def test_the_pages_redirect_only_to_the_loopback_callback(keycloak: Keycloak, redirect_uri: str) -> None:
    page = keycloak.http.get(
        keycloak.discovery()["authorization_endpoint"],
        params={
            "client_id": PAGES_CLIENT_ID,
            "response_type": "code",
            "scope": "openid",
            "redirect_uri": redirect_uri,
            "code_challenge": "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM",
            "code_challenge_method": "S256",
        },
    )
    assert page.status_code == 400
    assert "redirect_uri" in page.text


def test_the_pages_need_pkce(keycloak: Keycloak) -> None:
    redirect_uri = "http://127.0.0.1:8765/auth/callback"
    page = keycloak.http.get(
        keycloak.discovery()["authorization_endpoint"],
        params={"client_id": PAGES_CLIENT_ID, "response_type": "code", "redirect_uri": redirect_uri},
    )
    assert page.status_code == 302
    assert "error=invalid_request" in page.headers["location"]
    assert "code_challenge_method" in page.headers["location"]


def test_sign_out_returns_to_the_pages(keycloak: Keycloak) -> None:
    tokens = _sign_in_through_the_form(keycloak, "viktor", "http://127.0.0.1:8765/auth/callback")
    back = "http://127.0.0.1:8765/"
    signed_out = keycloak.http.get(
        keycloak.discovery()["end_session_endpoint"],
        params={"id_token_hint": tokens["id_token"], "post_logout_redirect_uri": back, "state": "bye"},
    )
    assert signed_out.status_code == 302
    assert signed_out.headers["location"].startswith(back + "?")
    # the session is over: its refresh token no longer works
    refreshed = keycloak.token_request(
        {
            "grant_type": "refresh_token",
            "refresh_token": tokens["refresh_token"],
            "client_id": PAGES_CLIENT_ID,
            "client_secret": PAGES_CLIENT_SECRET,
        }
    )
    assert refreshed.status_code == 400
    assert refreshed.json()["error"] == "invalid_grant"


def test_the_access_token_lifespan_can_be_shortened(keycloak: Keycloak) -> None:
    keycloak.set_access_token_lifespan(60)
    try:
        access = claims(keycloak.user_token("nils", PASSWORDS["nils"])["access_token"])
        assert access["exp"] - access["iat"] == 60
    finally:
        keycloak.set_access_token_lifespan(300)
