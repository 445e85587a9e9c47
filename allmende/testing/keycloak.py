"""A real Keycloak for the sign-in tests, with the realm of infra/keycloak/realm-allmende.json.

`make keycloak` unpacks the server distribution (Maven Central, infra/keycloak/pom.xml) into
infra/keycloak/dist. `running_keycloak(workdir)` runs it in development mode (in-memory H2) on a
free port of 127.0.0.1 and stops it after. The distribution is never written to: every run gets a
home of its own under `workdir` (kc.sh, conf and lib/quarkus copied; the 170 MB of jars, themes
and providers linked), where `--import-realm` finds the realm in data/import and Keycloak keeps
its transaction logs.

Development mode wants a server image built for it; the distribution's is built for production,
so the first run rebuilds it (Quarkus' augmentation: ~25 s more, ~50 s in all on two cores).
That image holds no paths, so it is kept next to the distribution (`<dist>.start-dev`, inside the
ignored infra/keycloak/dist) and copied into the next runs' homes: they answer in ~20 s, most of it
Keycloak's own bootstrap (the H2 schema, the master realm, the import).

Tokens: Keycloak's cookies are Secure, which browsers send to http://127.0.0.1 and localhost but
Python's cookie jar does not; a wrong user password is 400 invalid_grant, a wrong client secret
401 unauthorized_client.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import httpx

from allmende.core.kafka_local import free_port
from allmende.core.supervisor import Child

KEYCLOAK_VERSION = "26.7.3"  # infra/keycloak/pom.xml's keycloak.version
INFRA = Path(__file__).resolve().parents[2] / "infra" / "keycloak"
DIST = INFRA / "dist" / f"keycloak-{KEYCLOAK_VERSION}"
REALM_FILE = INFRA / "realm-allmende.json"

REALM = "allmende"
API_AUDIENCE = "allmende-api"  # every access token of the realm's clients is for it
ADMIN_USERNAME = "admin"  # the master realm's (bootstrap) admin
ADMIN_PASSWORD = "admin-test-pass"
PAGES_CLIENT_ID = "allmende-pages"  # authorization code + PKCE (S256), confidential
PAGES_CLIENT_SECRET = "allmende-pages-test-secret"
CLI_CLIENT_ID = "allmende-cli"  # client credentials (service account) and the device grant
CLI_CLIENT_SECRET = "allmende-cli-test-secret"
TEST_CLIENT_ID = "allmende-test"  # public, password grant: user tokens without a browser
CLIENT_SECRETS = {PAGES_CLIENT_ID: PAGES_CLIENT_SECRET, CLI_CLIENT_ID: CLI_CLIENT_SECRET}
PASSWORDS = {"ada": "ada-pass", "lena": "lena-pass", "viktor": "viktor-pass", "nils": "nils-pass"}
GROUPS = {"ada": ["/allmende-admins"], "lena": ["/leads/nlp"], "viktor": ["/leads/vision"], "nils": []}

START_TIMEOUT = 180.0
_KEY_PROVIDER = "org.keycloak.keys.KeyProvider"


class KeycloakError(RuntimeError):
    pass


@dataclass
class Keycloak:
    """A running Keycloak: its URLs, tokens of the realm's users and clients, a few admin calls."""

    base_url: str
    log_file: Path
    startup_seconds: float
    http: httpx.Client

    @property
    def issuer(self) -> str:
        return f"{self.base_url}/realms/{REALM}"

    @property
    def token_url(self) -> str:
        return f"{self.issuer}/protocol/openid-connect/token"

    @property
    def jwks_url(self) -> str:
        return f"{self.issuer}/protocol/openid-connect/certs"

    def discovery(self) -> dict[str, Any]:
        return _json(self.http.get(f"{self.issuer}/.well-known/openid-configuration"))

    def jwks(self) -> dict[str, Any]:
        return _json(self.http.get(self.jwks_url))

    def token_request(self, form: dict[str, str], realm: str = REALM) -> httpx.Response:
        """A POST to the realm's token endpoint, whatever it answers (for tests of refusals)."""
        return self.http.post(f"{self.base_url}/realms/{realm}/protocol/openid-connect/token", data=form)

    def admin_token(self) -> str:
        """An access token of the master realm's admin (admin-cli, password grant; valid 60 s)."""
        form = {
            "grant_type": "password",
            "client_id": "admin-cli",
            "username": ADMIN_USERNAME,
            "password": ADMIN_PASSWORD,
        }
        return str(_json(self.token_request(form, realm="master"))["access_token"])

    def user_token(self, username: str, password: str, client_id: str = TEST_CLIENT_ID) -> dict[str, Any]:
        """The token response of the password grant (access, refresh and ID token: scope openid);
        httpx.HTTPStatusError if Keycloak refuses."""
        form = {
            "grant_type": "password",
            "client_id": client_id,
            "username": username,
            "password": password,
            "scope": "openid",
        }
        if secret := CLIENT_SECRETS.get(client_id):
            form["client_secret"] = secret
        return _json(self.token_request(form))

    def client_credentials_token(self, client_id: str = CLI_CLIENT_ID) -> dict[str, Any]:
        """The token response of the client credentials grant (the client's service account)."""
        form = {
            "grant_type": "client_credentials",
            "client_id": client_id,
            "client_secret": CLIENT_SECRETS[client_id],
        }
        return _json(self.token_request(form))

    def admin(self, method: str, path: str, json: Any = None) -> httpx.Response:
        """A call to the realm's admin REST API (`path` after /admin/realms/allmende); raises on
        an error status."""
        response = self.http.request(
            method,
            f"{self.base_url}/admin/realms/{REALM}{path}",
            json=json,
            headers={"Authorization": f"Bearer {self.admin_token()}"},
        )
        response.raise_for_status()
        return response

    def rotate_signing_key(self) -> str:
        """Add an RS256 key (an `rsa-generated` key provider) with a higher priority than every
        key provider of the realm: new tokens are signed with it, the old key stays in the JWKS
        for the tokens already out. Returns the new key's id (`kid`)."""
        realm_id = self.admin("GET", "").json()["id"]
        providers = self.admin("GET", f"/components?type={_KEY_PROVIDER}").json()
        top = max((int(p.get("config", {}).get("priority", ["0"])[0]) for p in providers), default=0)
        created = self.admin(
            "POST",
            "/components",
            json={
                "name": f"rsa-rotated-{time.time_ns()}",
                "providerId": "rsa-generated",
                "providerType": _KEY_PROVIDER,
                "parentId": realm_id,
                "config": {
                    "priority": [str(top + 100)],
                    "enabled": ["true"],
                    "active": ["true"],
                    "algorithm": ["RS256"],
                    "keySize": ["2048"],
                },
            },
        )
        component_id = created.headers["Location"].rstrip("/").rsplit("/", 1)[-1]
        for key in self.admin("GET", "/keys").json()["keys"]:
            if key.get("providerId") == component_id:
                return str(key["kid"])
        raise KeycloakError(f"no key of the new key provider {component_id}")

    def set_access_token_lifespan(self, seconds: int) -> None:
        """The realm's access token lifespan (the realm file sets 300 s); for the tokens issued after."""
        self.admin("PUT", "", json={"accessTokenLifespan": seconds})


def _json(response: httpx.Response) -> dict[str, Any]:
    response.raise_for_status()
    return cast(dict[str, Any], response.json())


def java_binary() -> str:
    """$JAVA_HOME/bin/java if JAVA_HOME is set, else `java` on the PATH (Java 17+)."""
    if home := os.environ.get("JAVA_HOME"):
        return str(Path(home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise KeycloakError("Java 17+ is needed to run Keycloak (set JAVA_HOME or put java on the PATH)")
    return java


def _build_id(quarkus: Path) -> tuple[int, int] | None:
    """Identifies the server image in a lib/quarkus folder (changes when Keycloak rebuilds it)."""
    try:
        stat = (quarkus / "generated-bytecode.jar").stat()
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size


def _make_home(dist: Path, home: Path, realm_file: Path, image: Path) -> None:
    """A Keycloak home for one run: copies of what Keycloak reads from beside kc.sh or rewrites
    (kc.sh resolves its own links, so it is a copy; lib/quarkus is the server image), links to
    the rest, the realm in data/import."""
    (home / "bin").mkdir(parents=True)
    shutil.copy2(dist / "bin" / "kc.sh", home / "bin" / "kc.sh")
    shutil.copytree(dist / "conf", home / "conf")
    (home / "lib").mkdir()
    shutil.copy2(dist / "lib" / "quarkus-run.jar", home / "lib" / "quarkus-run.jar")
    shutil.copytree(image if _build_id(image) else dist / "lib" / "quarkus", home / "lib" / "quarkus")
    for shared in ("lib/lib", "lib/app", "themes", "providers"):
        (home / shared).symlink_to(dist / shared, target_is_directory=True)
    (home / "data" / "import").mkdir(parents=True)
    shutil.copy2(realm_file, home / "data" / "import" / realm_file.name)


def _keep_image(built: Path, image: Path) -> None:
    """Keep a server image that Keycloak built for development mode, for the next runs. Best
    effort: another run may be replacing it at the same time."""
    staging = image.with_name(f".{image.name}.{os.getpid()}")
    old = image.with_name(f".{image.name}.{os.getpid()}.old")
    try:
        shutil.copytree(built, staging)
        with suppress(FileNotFoundError):
            image.rename(old)
        staging.rename(image)
    except OSError:
        pass
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def _stop(child: Child, timeout: float = 30.0) -> None:
    """SIGTERM to kc.sh (it passes it on to the JVM); after `timeout`, SIGKILL to its session."""
    if not child.died():
        child.proc.terminate()
        try:
            child.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.proc.wait(10)
    child.stop()  # reaps it, closes the log


@contextmanager
def running_keycloak(
    workdir: Path,
    *,
    dist: Path = DIST,
    realm_file: Path = REALM_FILE,
    timeout: float = START_TIMEOUT,
) -> Iterator[Keycloak]:
    """Start Keycloak in development mode with the realm imported, wait until the realm's
    discovery document answers, yield it; stop it on exit. Its home and log (keycloak.log) are in
    `workdir`."""
    kc_sh = dist / "bin" / "kc.sh"
    if not kc_sh.is_file():
        raise KeycloakError(f"no Keycloak distribution at {dist}: run `make keycloak` (Maven Central)")
    workdir.mkdir(parents=True, exist_ok=True)
    home = workdir / "keycloak-home"
    image = dist.with_name(f"{dist.name}.start-dev")
    _make_home(dist, home, realm_file, image)
    seeded = _build_id(home / "lib" / "quarkus")
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    argv = [
        str(home / "bin" / "kc.sh"),
        "start-dev",
        "--http-host=127.0.0.1",
        f"--http-port={port}",
        f"--hostname={base_url}",  # one issuer, whichever host name a client uses
        "--db=dev-mem",
        "--import-realm",
    ]
    env = {
        **os.environ,
        "JAVA": java_binary(),
        "KC_BOOTSTRAP_ADMIN_USERNAME": ADMIN_USERNAME,
        "KC_BOOTSTRAP_ADMIN_PASSWORD": ADMIN_PASSWORD,
    }
    log_file = workdir / "keycloak.log"
    started = time.monotonic()
    child = Child(argv, log_file, env, cwd=workdir, session=True)
    try:
        discovery = f"{base_url}/realms/{REALM}/.well-known/openid-configuration"
        while not _answers(discovery):
            if child.died():
                raise KeycloakError(f"Keycloak exited ({child.proc.returncode}):\n{child.log_tail()}")
            if time.monotonic() - started > timeout:
                raise KeycloakError(f"Keycloak not ready after {timeout:.0f}s:\n{child.log_tail()}")
            time.sleep(0.25)
        startup = time.monotonic() - started
        if _build_id(home / "lib" / "quarkus") != seeded:
            _keep_image(home / "lib" / "quarkus", image)
        with httpx.Client(timeout=30.0) as http:
            yield Keycloak(base_url=base_url, log_file=log_file, startup_seconds=startup, http=http)
    finally:
        _stop(child)
