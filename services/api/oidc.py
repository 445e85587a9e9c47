"""The organisation's identity provider (OIDC): its discovery document, its keys, and who its
tokens say someone is (docs/auth.md).

Two kinds of token are checked here, both with PyJWT against the issuer's JWKS (never a
hand-written JOSE): the ID token the pages' sign-in receives (audience: our client id, with the
nonce the sign-in sent), and the access tokens scripts and the CLI send as `Bearer` (audience:
`oidc_audience`). Both must be signed with an asymmetric algorithm the issuer publishes a key for
(`alg: none` and HMAC never pass), by the configured issuer, unexpired. The JWKS is cached and
fetched again when a token names a key id it does not hold (a rotated key), at most once per
`JWKS_COOLDOWN_S`, so tokens with made-up key ids cannot make the API hammer the IdP.

Who is what comes from one claim (`oidc_roles_claim`, a dotted path: Keycloak's `groups` with full
paths, or `realm_access.roles`): a value among `oidc_admin_values` makes an admin, a value matching
`oidc_lead_pattern` (`/leads/{node}`) a lead of that node (a project or a group of the
organisation, and everything below it); anything else is nobody the dashboards serve.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx
import jwt
from jwt import PyJWKClient

from allmende.core.settings import Settings
from allmende.schemas.events import valid_name
from allmende.services.api.auth import Principal, TokenRejected

# Asymmetric only: a token "signed" with the client secret (HS256) or with nothing proves nothing.
ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"]
JWKS_COOLDOWN_S = 5.0  # an unknown key id fetches the JWKS again at most this often
DISCOVERY_TTL_S = 3600.0


@dataclass(frozen=True)
class Provider:
    """The endpoints of the issuer's discovery document."""

    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    end_session_endpoint: str | None
    device_authorization_endpoint: str | None  # `allmende login`'s device flow


def _split(values: str) -> set[str]:
    return {v.strip() for v in values.split(",") if v.strip()}


def claim_values(claims: dict[str, Any], path: str) -> list[str]:
    """The strings at a dotted claim path (`realm_access.roles`): a list, or one string."""
    found: Any = claims
    for part in path.split("."):
        if not isinstance(found, dict):
            return []
        found = found.get(part)
    if isinstance(found, str):
        return [found]
    if isinstance(found, list):
        return [v for v in found if isinstance(v, str)]
    return []


def _is_name(value: str) -> bool:
    try:
        valid_name(value)
    except ValueError:
        return False
    return True


class RoleMap:
    """Claims -> a principal, by the site's configuration (Settings.oidc_*)."""

    def __init__(self, settings: Settings) -> None:
        self.claim = settings.oidc_roles_claim
        self.name_claim = settings.oidc_name_claim
        self.admin_values = _split(settings.oidc_admin_values)
        prefix, marker, suffix = settings.oidc_lead_pattern.partition("{node}")
        if not marker:
            raise ValueError("ALLMENDE_OIDC_LEAD_PATTERN must hold {node}, e.g. /leads/{node}")
        self.lead = re.compile(re.escape(prefix) + "(.+)" + re.escape(suffix) + r"\Z")

    def name_of(self, claims: dict[str, Any]) -> str:
        name = claims.get(self.name_claim) or claims.get("sub")
        if not isinstance(name, str) or not name:
            raise TokenRejected(f"the token has no {self.name_claim} nor sub claim")
        return name[:200]

    def principal(self, claims: dict[str, Any]) -> Principal | None:
        """Who the claims make an admin or a lead of some nodes; None: neither."""
        name = self.name_of(claims)
        values = claim_values(claims, self.claim)
        if self.admin_values.intersection(values):
            return Principal(name, "admin")
        led = frozenset(m.group(1) for v in values if (m := self.lead.match(v)) and _is_name(m.group(1)))
        return Principal(name, "lead", led) if led else None


class IdentityProvider:
    """One issuer: discovery (cached), keys (cached, refreshed on an unknown key id), tokens checked.

    Blocking (HTTP to the IdP on a cache miss): callers on the event loop run it in a thread.
    """

    def __init__(self, settings: Settings) -> None:
        self.issuer = settings.oidc_issuer.rstrip("/")
        self.client_id = settings.oidc_client_id
        self.audience = settings.oidc_audience
        self.roles = RoleMap(settings)
        self.leeway_s = settings.oidc_clock_skew_s
        self._provider: Provider | None = None
        self._fetched_at = 0.0
        self._jwks: PyJWKClient | None = None
        self._lock = threading.Lock()

    def provider(self) -> Provider:
        with self._lock:
            if self._provider is None or time.monotonic() - self._fetched_at > DISCOVERY_TTL_S:
                url = f"{self.issuer}/.well-known/openid-configuration"
                try:
                    response = httpx.get(url, timeout=10.0)
                    response.raise_for_status()
                    doc = response.json()
                except (httpx.HTTPError, ValueError) as exc:
                    raise TokenRejected(f"the identity provider's discovery document ({url}): {exc}") from exc
                if doc.get("issuer", "").rstrip("/") != self.issuer:
                    named = doc.get("issuer")
                    raise TokenRejected(f"the discovery document names issuer {named!r}, not {self.issuer!r}")
                self._provider = Provider(
                    issuer=doc["issuer"],
                    authorization_endpoint=doc["authorization_endpoint"],
                    token_endpoint=doc["token_endpoint"],
                    jwks_uri=doc["jwks_uri"],
                    end_session_endpoint=doc.get("end_session_endpoint"),
                    device_authorization_endpoint=doc.get("device_authorization_endpoint"),
                )
                self._fetched_at = time.monotonic()
                self._jwks = PyJWKClient(
                    self._provider.jwks_uri, cooldown_duration=JWKS_COOLDOWN_S, timeout=10
                )
            return self._provider

    def _claims(self, token: str, audience: str, nonce: str | None = None) -> dict[str, Any]:
        provider = self.provider()
        assert self._jwks is not None  # set with the provider
        try:
            key = self._jwks.get_signing_key_from_jwt(token)
            # The key's own algorithm only: a header naming another cannot pick how it is checked.
            allowed = [key.algorithm_name] if key.algorithm_name in ALGORITHMS else []
            if not allowed:
                raise TokenRejected(f"the issuer's key {key.key_id} is not for an asymmetric algorithm")
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=allowed,
                audience=audience,
                issuer=provider.issuer,
                leeway=self.leeway_s,
                options={"require": ["exp", "iat", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError as exc:
            raise TokenRejected("the token has expired") from exc
        except jwt.InvalidAudienceError as exc:
            raise TokenRejected(f"the token is not meant for {audience}") from exc
        except jwt.InvalidIssuerError as exc:
            raise TokenRejected(f"the token was not issued by {provider.issuer}") from exc
        except (jwt.PyJWTError, TypeError, ValueError, KeyError) as exc:  # whatever a forged token holds
            raise TokenRejected(f"the token is not valid: {type(exc).__name__}: {exc}"[:300]) from exc
        if nonce is not None and claims.get("nonce") != nonce:
            raise TokenRejected("the ID token's nonce is not the sign-in's")
        return claims

    @staticmethod
    def may_have_issued(token: str) -> bool:
        """A JWS in compact form (three dot-separated parts), not a static token."""
        return token.count(".") == 2 and len(token) > 40

    def id_token_claims(self, id_token: str, nonce: str) -> dict[str, Any]:
        return self._claims(id_token, self.client_id, nonce)

    def bearer_principal(self, token: str) -> Principal:
        """The principal an access token proves; TokenRejected if it proves none, PermissionError
        if it proves someone the API serves nothing."""
        claims = self._claims(token, self.audience)
        principal = self.roles.principal(claims)
        if principal is None:
            raise PermissionError(f"{self.roles.name_of(claims)} is neither an admin nor a project lead")
        return principal
