"""A real Kubernetes API server with Kueue for the Kueue tests: etcd, kube-apiserver and Kueue's
manager on 127.0.0.1, no kubelet, no kube-controller-manager.

`make kubernetes` (infra/kubernetes/build.sh) builds the three binaries from the Go module proxy
into infra/kubernetes/bin (etcd v3.6.8, kube-apiserver v1.35.3, Kueue v0.17.0, the versions of
the go.mod/go.sum files beside it) and copies Kueue's CRD and webhook manifests into
bin/kueue-config. `running_kubernetes(workdir)` starts them on free ports, everything they write
under `workdir`, and stops them after (Kueue, the API server, etcd):

- a CA of its own (its certificate is the `ca_file` of the cluster), serving certificates for the
  API server and Kueue's webhook server with SAN IP:127.0.0.1, a service-account RSA key pair and
  a token file with one admin (group system:masters): the token is `KubeCluster.token`;
- etcd (data dir in `workdir`), then kube-apiserver (RBAC, token authentication; until /readyz);
- a kubeconfig for the admin (`KubeCluster.kubeconfig`; Debian's kubectl 1.32 works with it, with
  a version skew warning);
- Kueue's CRDs (the five that Kueue's kustomization gives a conversion webhook get it, at
  https://127.0.0.1:<webhook port>/convert) and its webhook configurations, pointed at its webhook
  server by URL with the CA as caBundle instead of the in-cluster service, the kueue-system
  namespace;
- Kueue itself, outside the cluster (KUBECONFIG, a Configuration file), with the batch/job
  integration only, no leader election, no internal certificate management (so it reads the
  metrics server's certificate from /etc/kueue/metrics/certs: created here if missing, which takes
  root) and the on-demand visibility server off (it wants certificates of its own). Ready when its
  health endpoint is and the API server gets a Job suspended by its webhook (a dry run).

Without a kubelet and a job controller no pod runs: what they would write (a Job's
status.startTime, active, completion) a test writes itself through the status subresource.
From a clean data dir all this is ready in 5-7 s on two cores (etcd <1 s, the API server's
/readyz at about 3 s, Kueue's manifests 1.5 s, Kueue 0.3 s) and takes about 590 MB resident
(kube-apiserver 430, Kueue 85, etcd 70).
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import httpx
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from allmende.core.kafka_local import free_port
from allmende.core.supervisor import Child

ETCD_VERSION = "v3.6.8"  # infra/kubernetes/etcd/go.mod
KUBERNETES_VERSION = "v1.35.3"  # infra/kubernetes/apiserver/go.mod
KUEUE_VERSION = "v0.17.0"  # infra/kubernetes/kueue/go.mod
INFRA = Path(__file__).resolve().parents[2] / "infra" / "kubernetes"
BIN = INFRA / "bin"
ETCD = BIN / "etcd"
KUBE_APISERVER = BIN / "kube-apiserver"
KUEUE = BIN / "kueue"
KUEUE_CONFIG = BIN / "kueue-config"  # Kueue's config/components/{crd,webhook}

KUEUE_NAMESPACE = "kueue-system"
KUEUE_NAME_PREFIX = "kueue-"  # what Kueue's config/default kustomization puts before the names
ADMIN_USER = "allmende-admin"
FIELD_MANAGER = "allmende-test"  # this module's server-side applies
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")  # fixed in Kueue's cmd/kueue/main.go
START_TIMEOUT = 120.0
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"


class KubernetesError(RuntimeError):
    pass


@dataclass
class KubeCluster:
    """A running etcd + kube-apiserver + Kueue. `http` talks to the API server as the admin (its
    base URL is `server`, the CA verified); `request`, `get`, `create` and `apply` are calls with
    it that raise on an error status."""

    server: str  # https://127.0.0.1:<port>
    token: str  # the admin's bearer token (system:masters)
    ca_file: Path  # the CA of the API server's and Kueue's serving certificates (PEM)
    kubeconfig: Path  # the admin's kubeconfig (`kubectl --kubeconfig`)
    log_files: dict[str, Path]  # "etcd", "kube-apiserver", "kueue"
    startup_seconds: float  # from starting etcd until Kueue's webhook suspends a Job
    phase_seconds: dict[str, float]  # when each step was done, seconds after the start
    pids: dict[str, int]
    etcd_url: str
    webhook_port: int  # Kueue's webhook server
    http: httpx.Client = field(repr=False)

    def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """A call to the API server (`path` from the root, e.g. /api/v1/namespaces); its JSON
        answer. KubernetesError with the API server's message on an error status."""
        content = None if json_body is None else json.dumps(json_body)
        headers = {"Content-Type": content_type} if content is not None else {}
        response = self.http.request(method, path, content=content, params=params, headers=headers)
        if response.is_error:
            raise KubernetesError(f"{method} {path}: {response.status_code} {response.text}")
        return cast(dict[str, Any], response.json())

    def get(self, path: str) -> dict[str, Any]:
        return self.request("GET", path)

    def create(self, path: str, obj: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        """POST `obj` to the collection at `path`; the object as the API server stored it."""
        return self.request("POST", path, json_body=obj, params={"dryRun": "All"} if dry_run else None)

    def apply(
        self, path: str, obj: dict[str, Any], *, field_manager: str = FIELD_MANAGER, force: bool = True
    ) -> dict[str, Any]:
        """Server-side apply of `obj` (apiVersion, kind, metadata.name and the fields to own) at
        the object's `path`, e.g. `.../workloads/<name>/status` for a status subresource."""
        params = {"fieldManager": field_manager, "force": "true" if force else "false"}
        return self.request(
            "PATCH", path, json_body=obj, params=params, content_type="application/apply-patch+yaml"
        )

    def rss_mb(self) -> dict[str, float]:
        """Resident memory of each process, MB (from /proc; 0 for one that is gone)."""
        return {name: _rss_mb(pid) for name, pid in self.pids.items()}


def missing_binaries(bin_dir: Path = BIN) -> list[Path]:
    """What `make kubernetes` builds and is not there."""
    wanted = [bin_dir / "etcd", bin_dir / "kube-apiserver", bin_dir / "kueue"]
    missing = [path for path in wanted if not os.access(path, os.X_OK)]
    config = bin_dir / "kueue-config"
    for manifests in (
        config / "crd" / "bases",
        config / "crd" / "kustomization.yaml",
        config / "webhook" / "manifests.yaml",
        config / "webhook" / "kustomization.yaml",
    ):
        if not manifests.exists():
            missing.append(manifests)
    return missing


@contextmanager
def running_kubernetes(
    workdir: Path, *, bin_dir: Path = BIN, timeout: float = START_TIMEOUT
) -> Iterator[KubeCluster]:
    """Start etcd, kube-apiserver and Kueue on free ports of 127.0.0.1 with their data, keys and
    logs in `workdir`, install Kueue's CRDs and webhooks, wait until Kueue's webhook works, yield
    the cluster; stop them on exit (Kueue, the API server, etcd)."""
    if missing := missing_binaries(bin_dir):
        raise KubernetesError(f"not built: {', '.join(map(str, missing))}: run `make kubernetes` first")
    workdir.mkdir(parents=True, exist_ok=True)
    pki = _Pki.create(workdir / "pki")
    _ensure_metrics_certificate(pki)
    token = base64.urlsafe_b64encode(os.urandom(24)).decode().rstrip("=")
    token_file = workdir / "pki" / "tokens.csv"
    token_file.write_text(f'{token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n')
    token_file.chmod(0o600)

    logs = {name: workdir / f"{name}.log" for name in ("etcd", "kube-apiserver", "kueue")}
    phases: dict[str, float] = {}
    started = time.monotonic()
    with ExitStack() as stack:
        # etcd
        client_port, peer_port = free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{client_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        etcd = _start(stack, [
            str(bin_dir / "etcd"),
            "--name=default",
            f"--data-dir={workdir / 'etcd-data'}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=default={peer_url}",
            "--unsafe-no-fsync",  # a throwaway data dir: no fsync waits on slow disks
            "--log-level=warn",
        ], logs["etcd"], workdir)  # fmt: skip
        deadline = started + timeout
        _wait(etcd, "etcd", deadline, lambda: _answers(f"{etcd_url}/health", b'"health":"true"'))
        phases["etcd"] = time.monotonic() - started

        # kube-apiserver
        port = free_port()
        server = f"https://127.0.0.1:{port}"
        apiserver = _start(stack, [
            str(bin_dir / "kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={pki.dir}",
            f"--tls-cert-file={pki.apiserver_cert}",
            f"--tls-private-key-file={pki.apiserver_key}",
            f"--client-ca-file={pki.ca_cert}",
            f"--token-auth-file={token_file}",
            "--authorization-mode=RBAC",
            f"--service-account-issuer={server}",
            f"--service-account-key-file={pki.sa_public}",
            f"--service-account-signing-key-file={pki.sa_private}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--disable-admission-plugins=ServiceAccount",
            "--endpoint-reconciler-type=none",
        ], logs["kube-apiserver"], workdir)  # fmt: skip
        http = stack.enter_context(
            httpx.Client(
                base_url=server,
                verify=str(pki.ca_cert),
                headers={"Authorization": f"Bearer {token}"},
                timeout=30.0,
            )
        )
        _wait(apiserver, "kube-apiserver", deadline, lambda: _ok(http, "/readyz"))
        phases["kube-apiserver"] = time.monotonic() - started
        kubeconfig = _write_kubeconfig(workdir / "kubeconfig", server, pki.ca_cert, token)

        # Kueue's namespace, CRDs and webhooks, then Kueue
        webhook_port = free_port()
        cluster = KubeCluster(
            server=server,
            token=token,
            ca_file=pki.ca_cert,
            kubeconfig=kubeconfig,
            log_files=logs,
            startup_seconds=0.0,
            phase_seconds=phases,
            pids={"etcd": etcd.pid, "kube-apiserver": apiserver.pid},
            etcd_url=etcd_url,
            webhook_port=webhook_port,
            http=http,
        )
        _install_kueue_manifests(cluster, bin_dir / "kueue-config", pki.ca_cert.read_bytes(), deadline)
        phases["kueue-manifests"] = time.monotonic() - started
        health_port = free_port()
        config_file = _write_kueue_configuration(
            workdir / "kueue-configuration.yaml",
            health_port=health_port,
            metrics_port=free_port(),
            webhook_port=webhook_port,
            cert_dir=pki.webhook_dir,
        )
        kueue = _start(
            stack,
            [str(bin_dir / "kueue"), f"--config={config_file}", "--feature-gates=VisibilityOnDemand=false"],
            logs["kueue"],
            workdir,
            env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        )
        cluster.pids["kueue"] = kueue.pid
        _wait(kueue, "Kueue", deadline, lambda: _answers(f"http://127.0.0.1:{health_port}/readyz", b"ok"))
        _wait(kueue, "Kueue's webhook", deadline, lambda: _webhook_suspends_jobs(cluster))
        cluster.startup_seconds = phases["kueue"] = time.monotonic() - started
        yield cluster


# --- processes ----------------------------------------------------------------------------------


def _start(
    stack: ExitStack, argv: list[str], log: Path, cwd: Path, env: dict[str, str] | None = None
) -> Child:
    """Start `argv` (its own session, output to `log`), to be stopped when `stack` unwinds."""
    child = Child(argv, log, env if env is not None else dict(os.environ), cwd=cwd, session=True)
    stack.callback(child.stop)
    return child


def _wait(child: Child, what: str, deadline: float, ready: Callable[[], bool]) -> None:
    while not ready():
        if child.died():
            raise KubernetesError(f"{what} exited ({child.proc.returncode}):\n{child.log_tail()}")
        if time.monotonic() > deadline:
            raise KubernetesError(f"{what} not ready in time ({child.log_path}):\n{child.log_tail()}")
        time.sleep(0.1)


def _answers(url: str, expect: bytes) -> bool:
    try:
        response = httpx.get(url, timeout=2.0)
    except httpx.HTTPError:
        return False
    return response.status_code == 200 and expect in response.content


def _ok(http: httpx.Client, path: str) -> bool:
    try:
        return http.get(path, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def _rss_mb(pid: int) -> float:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


# --- certificates and keys ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Pki:
    dir: Path
    ca_cert: Path
    apiserver_cert: Path
    apiserver_key: Path
    webhook_dir: Path  # tls.crt, tls.key: Kueue's webhook server
    sa_private: Path
    sa_public: Path
    ca_key: ec.EllipticCurvePrivateKey
    ca: x509.Certificate

    @classmethod
    def create(cls, pki: Path) -> _Pki:
        pki.mkdir(parents=True, exist_ok=True)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "allmende-test-ca")])
        now = datetime.datetime.now(datetime.UTC)
        ca = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=7))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(_key_usage(cert_sign=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        ca_cert = pki / "ca.crt"
        ca_cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        _write_key(pki / "ca.key", ca_key)
        webhook_dir = pki / "kueue-webhook"
        webhook_dir.mkdir(exist_ok=True)
        sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        _write_key(pki / "service-account.key", sa_key)
        (pki / "service-account.pub").write_bytes(
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        result = cls(
            dir=pki,
            ca_cert=ca_cert,
            apiserver_cert=pki / "apiserver.crt",
            apiserver_key=pki / "apiserver.key",
            webhook_dir=webhook_dir,
            sa_private=pki / "service-account.key",
            sa_public=pki / "service-account.pub",
            ca_key=ca_key,
            ca=ca,
        )
        result.issue("kube-apiserver", result.apiserver_cert, result.apiserver_key)
        result.issue("kueue-webhook", webhook_dir / "tls.crt", webhook_dir / "tls.key")
        return result

    def issue(self, common_name: str, cert_path: Path, key_path: Path, days: int = 7) -> None:
        """A serving certificate of this CA for 127.0.0.1 and localhost."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        san = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(cert_sign=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName(san), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.ca_key.public_key()), critical=False
            )
            .sign(self.ca_key, hashes.SHA256())
        )
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key_path, key)


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path.touch(mode=0o600)
    path.write_bytes(pem)


def _ensure_metrics_certificate(pki: _Pki, cert_dir: Path = METRICS_CERT_DIR) -> None:
    """Kueue's metrics server reads its certificate from /etc/kueue/metrics/certs when its internal
    certificate management is off: one of this run's CA if there is none (nobody verifies it)."""
    if (cert_dir / "tls.crt").is_file() and (cert_dir / "tls.key").is_file():
        return
    try:
        cert_dir.mkdir(parents=True, exist_ok=True)
        staging = cert_dir / f".new-{os.getpid()}"
        staging.mkdir(exist_ok=True)
        pki.issue("kueue-metrics", staging / "tls.crt", staging / "tls.key", days=3650)
        for name in ("tls.key", "tls.crt"):
            (staging / name).replace(cert_dir / name)
        staging.rmdir()
    except PermissionError as error:
        raise KubernetesError(
            f"Kueue reads its metrics certificate from {cert_dir}/tls.{{crt,key}}; creating them "
            f"takes root ({error})"
        ) from error


# --- kubeconfig, Kueue's manifests and configuration --------------------------------------------


def _write_kubeconfig(path: Path, server: str, ca_file: Path, token: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "allmende-test", "cluster": {"server": server, "certificate-authority": str(ca_file)}}
        ],
        "users": [{"name": ADMIN_USER, "user": {"token": token}}],
        "contexts": [{"name": "allmende-test", "context": {"cluster": "allmende-test", "user": ADMIN_USER}}],
        "current-context": "allmende-test",
    }
    path.touch(mode=0o600)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _load_yaml(path: Path) -> list[dict[str, Any]]:
    """The documents of a YAML file; with libyaml where PyYAML has it (Kueue's CRDs are 1.6 MB:
    1.2 s in pure Python, 0.1 s with libyaml)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return [doc for doc in yaml.load_all(path.read_text(), Loader=loader) if doc]


def _conversion_patches(crd_dir: Path) -> dict[str, dict[str, Any]]:
    """CRD name -> its spec.conversion, for the CRDs that Kueue's crd/kustomization.yaml patches
    with a conversion webhook (patches/webhook_in_*.yaml; v0.17.0: localqueues, clusterqueues,
    cohorts, workloads, multikueueclusters)."""
    kustomization = _load_yaml(crd_dir / "kustomization.yaml")[0]
    patches: dict[str, dict[str, Any]] = {}
    for patch in kustomization.get("patches", []):
        path = patch.get("path", "") if isinstance(patch, dict) else ""
        if Path(path).name.startswith("webhook_in_"):
            for doc in _load_yaml(crd_dir / path):
                patches[doc["metadata"]["name"]] = doc["spec"]["conversion"]
    return patches


def _by_url(client_config: dict[str, Any], webhook_port: int, ca_bundle: str) -> dict[str, Any]:
    """A clientConfig naming Kueue's in-cluster service rewritten to its URL on 127.0.0.1."""
    path = client_config.get("service", {}).get("path", "")
    return {"url": f"https://127.0.0.1:{webhook_port}{path}", "caBundle": ca_bundle}


def _webhook_configurations(webhook_dir: Path, webhook_port: int, ca_bundle: str) -> list[dict[str, Any]]:
    """Kueue's Mutating- and ValidatingWebhookConfiguration (webhook/manifests.yaml) as its
    config/default kustomization makes them (the kueue- name prefix, the namespaceSelector patches
    of webhook/kustomization.yaml), their clientConfig by URL."""
    configurations = _load_yaml(webhook_dir / "manifests.yaml")
    kustomization = _load_yaml(webhook_dir / "kustomization.yaml")[0]
    for entry in kustomization.get("patches", []):
        for patch in yaml.safe_load_all(entry.get("patch", "")) if isinstance(entry, dict) else []:
            if not patch:
                continue
            for configuration in configurations:
                if (configuration["kind"], configuration["metadata"]["name"]) != (
                    patch["kind"],
                    patch["metadata"]["name"],
                ):
                    continue
                changes = {hook["name"]: hook for hook in patch.get("webhooks", [])}
                for hook in configuration["webhooks"]:
                    hook.update({k: v for k, v in changes.get(hook["name"], {}).items() if k != "name"})
    for configuration in configurations:
        configuration["metadata"]["name"] = KUEUE_NAME_PREFIX + configuration["metadata"]["name"]
        for hook in configuration["webhooks"]:
            hook["clientConfig"] = _by_url(hook["clientConfig"], webhook_port, ca_bundle)
    return configurations


def _install_kueue_manifests(cluster: KubeCluster, config_dir: Path, ca_pem: bytes, deadline: float) -> None:
    ca_bundle = base64.b64encode(ca_pem).decode()
    cluster.apply(
        f"/api/v1/namespaces/{KUEUE_NAMESPACE}",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUEUE_NAMESPACE}},
    )
    conversions = _conversion_patches(config_dir / "crd")
    names = []
    for crd_file in sorted((config_dir / "crd" / "bases").glob("*.yaml")):
        for crd in _load_yaml(crd_file):
            name = crd["metadata"]["name"]
            if (conversion := conversions.get(name)) is not None:
                webhook = conversion["webhook"]
                crd["spec"]["conversion"] = {
                    **conversion,
                    "webhook": {
                        **webhook,
                        "clientConfig": _by_url(webhook["clientConfig"], cluster.webhook_port, ca_bundle),
                    },
                }
            cluster.apply(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}", crd)
            names.append(name)
    for configuration in _webhook_configurations(config_dir / "webhook", cluster.webhook_port, ca_bundle):
        plural = configuration["kind"].lower() + "s"
        cluster.apply(
            f"/apis/admissionregistration.k8s.io/v1/{plural}/{configuration['metadata']['name']}",
            configuration,
        )
    for name in names:  # Kueue's informers need them served
        while not _established(cluster, name):
            if time.monotonic() > deadline:
                raise KubernetesError(f"the CRD {name} is not established")
            time.sleep(0.1)


def _established(cluster: KubeCluster, crd: str) -> bool:
    status = cluster.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}").get("status", {})
    return any(c["type"] == "Established" and c["status"] == "True" for c in status.get("conditions") or [])


def _write_kueue_configuration(
    path: Path, *, health_port: int, metrics_port: int, webhook_port: int, cert_dir: Path
) -> Path:
    configuration = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "integrations": {"frameworks": ["batch/job"]},
        "clientConnection": {"qps": 200, "burst": 400},
    }
    path.write_text(yaml.safe_dump(configuration, sort_keys=False))
    return path


def _webhook_suspends_jobs(cluster: KubeCluster) -> bool:
    """Whether the API server gets a queued Job suspended by Kueue's webhook (a dry run, in the
    default namespace)."""
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "kueue-probe", "labels": {"kueue.x-k8s.io/queue-name": "probe"}},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "probe", "image": "busybox"}],
                }
            }
        },
    }
    try:
        created = cluster.create("/apis/batch/v1/namespaces/default/jobs", job, dry_run=True)
    except (KubernetesError, httpx.HTTPError):
        return False  # the webhook not answering yet (failurePolicy: Fail), or no default namespace yet
    return created.get("spec", {}).get("suspend") is True


def gpu_job_manifest(
    namespace: str, queue: str, name: str, gpus: int,
    labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """A batch/v1 Job of one pod asking for `gpus` GPUs, queued in the LocalQueue `queue`."""
    limits = {"nvidia.com/gpu": str(gpus)}
    container = {"name": "train", "image": "registry.example/train:1",
                 "resources": {"requests": {"cpu": "1", **limits}, "limits": limits}}  # fmt: skip
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"kueue.x-k8s.io/queue-name": queue, **(labels or {})},
            "annotations": annotations or {},
        },
        "spec": {
            "parallelism": 1,
            "completions": 1,
            "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
        },
    }
