"""The API takes the organisation's access tokens (Bearer JWTs from a real Keycloak): signed by
the realm's current key, by the configured issuer, for the API's audience, unexpired; anything
else is 401 with the reason (services/api/oidc.py, docs/auth.md)."""

from __future__ import annotations

import base64
import json
import time

import httpx

from allmende.testing.keycloak import Keycloak
from tests.auth.conftest import IdpApi


def _get(api: IdpApi, path: str, token: str) -> httpx.Response:
    return httpx.get(f"{api.url}{path}", headers={"Authorization": f"Bearer {token}"}, timeout=30)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _parts(token: str) -> tuple[dict[str, object], dict[str, object], str]:
    header, payload, signature = token.split(".")
    pad = lambda s: s + "=" * (-len(s) % 4)  # noqa: E731
    decoded = [json.loads(base64.urlsafe_b64decode(pad(part))) for part in (header, payload)]
    return decoded[0], decoded[1], signature


def test_a_leads_token_reads_their_projects_and_no_others(keycloak: Keycloak, idp_api: IdpApi) -> None:
    lena = keycloak.user_token("lena", "lena-pass")["access_token"]
    assert _get(idp_api, "/v1/projects/nlp/balance", lena).status_code == 200
    refused = _get(idp_api, "/v1/projects/vision/balance", lena)
    assert refused.status_code == 403 and "lena does not lead vision" in refused.text
    ada = keycloak.user_token("ada", "ada-pass")["access_token"]
    assert _get(idp_api, "/v1/projects/vision/balance", ada).status_code == 200
    assert _get(idp_api, "/v1/admin/disputes", ada).status_code == 200
    assert _get(idp_api, "/v1/admin/disputes", lena).status_code == 403
    nils = keycloak.user_token("nils", "nils-pass")["access_token"]
    nobody = _get(idp_api, "/v1/projects/nlp/balance", nils)
    assert nobody.status_code == 403 and "neither an admin nor a project lead" in nobody.text


def test_forged_and_foreign_tokens_are_401_with_the_reason(keycloak: Keycloak, idp_api: IdpApi) -> None:
    token = keycloak.user_token("lena", "lena-pass")
    header, payload, signature = _parts(token["access_token"])
    head, body = token["access_token"].split(".")[:2]

    # tampered: lena makes herself an admin, the signature no longer matches
    payload_admin = dict(payload, groups=["/allmende-admins"])
    tampered = f"{head}.{_b64(json.dumps(payload_admin).encode())}.{signature}"
    # unsigned: alg none, no signature
    unsigned = f"{_b64(json.dumps(dict(header, alg='none')).encode())}.{body}."
    # wrong audience: the ID token, validly signed, is for the client, not for the API
    wrong_audience = token["id_token"]
    # wrong issuer: a token of the same Keycloak's master realm (its own key and issuer)
    wrong_issuer = keycloak.admin_token()
    assert _parts(wrong_issuer)[1]["iss"] != keycloak.issuer

    reasons = {
        "tampered": (tampered, "not valid"),
        "unsigned": (unsigned, "not valid"),
        "wrong audience": (wrong_audience, "not meant for allmende-api"),
        "wrong issuer": (wrong_issuer, "not valid"),  # its key is not among the issuer's
        "garbage": (".".join(["x" * 20, "y" * 20, "z" * 20]), "not valid"),
    }
    for case, (bad, why) in reasons.items():
        answer = _get(idp_api, "/v1/projects/nlp/balance", bad)
        assert answer.status_code == 401, (case, answer.text)
        assert why in answer.json()["detail"], (case, answer.text)
        assert answer.headers["www-authenticate"].startswith("Bearer")
    assert _get(idp_api, "/v1/projects/nlp/balance", token["access_token"]).status_code == 200


def test_an_expired_token_is_401(keycloak: Keycloak, idp_api: IdpApi) -> None:
    keycloak.set_access_token_lifespan(2)
    try:
        short = keycloak.user_token("lena", "lena-pass")["access_token"]
    finally:
        keycloak.set_access_token_lifespan(300)
    assert _get(idp_api, "/v1/projects/nlp/balance", short).status_code == 200
    time.sleep(2 + idp_api.clock_skew_s + 1)
    answer = _get(idp_api, "/v1/projects/nlp/balance", short)
    assert answer.status_code == 401 and "expired" in answer.json()["detail"]


def test_a_rotated_signing_key_is_picked_up(keycloak: Keycloak, idp_api: IdpApi) -> None:
    before = keycloak.user_token("ada", "ada-pass")["access_token"]
    assert _get(idp_api, "/v1/admin/disputes", before).status_code == 200  # the JWKS is cached now
    new_kid = keycloak.rotate_signing_key()
    after = keycloak.user_token("ada", "ada-pass")["access_token"]
    assert _parts(after)[0]["kid"] == new_kid != _parts(before)[0]["kid"]
    deadline = time.monotonic() + 15  # an unknown key id fetches the keys again (5 s cooldown at most)
    while (status := _get(idp_api, "/v1/admin/disputes", after).status_code) != 200:
        assert time.monotonic() < deadline, status
        time.sleep(1)
    assert status == 200


def test_a_service_accounts_token_with_no_role_is_403_not_401(keycloak: Keycloak, idp_api: IdpApi) -> None:
    token = keycloak.client_credentials_token()["access_token"]
    answer = _get(idp_api, "/v1/projects/nlp/balance", token)
    assert answer.status_code == 403  # a valid token of someone the API serves nothing
