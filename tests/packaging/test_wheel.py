"""The wheel as a user gets it (issue 27): built from the checkout, installed with its dependencies
into a fresh virtualenv, run from a directory outside the checkout.

The installed `allmende` answers --help; its meter worker and API run against the test broker with
all state under ALLMENDE_STATE_DIR; a quarter plan applied and an ElasticFlow trace replayed with
the installed CLI show up, exactly, in the project's balance; the pages and the vendored ECharts
are served from the package. Afterwards site-packages is as pip left it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import uuid
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from allmende.core.kafka_local import free_port
from allmende.core.supervisor import Child, wait_until
from allmende.core.trace_files import read_trace
from allmende.domain.charging import CHARGE_UNITS_PER_GPU_SECOND
from allmende.domain.traces import TraceFormat

pytestmark = pytest.mark.integration

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]
PROJECT = "ef-cluster01"
CLUSTER = "cluster01"  # the CSV of the ElasticFlow tarball whose jobs are PROJECT's
JOBS = 40  # the first jobs of the trace: 2021-03-26 .. 27, 40 jobs, about 250 events
# Flat prices (every factor 1.00): a GPU-second charges CHARGE_UNITS_PER_GPU_SECOND units, so the
# balance can be checked against the trace exactly. The period covers the replayed jobs' dates.
PLAN = """\
    plan: packaging-check
    period: {start: 2021-03-01, end: 2021-06-01}
    clusters:
      - {name: ef-cluster01, gpu_type: V100, gpus: 384}
    organisation:
      - {id: institute, kind: organisation, shares: 100, leads: [dana]}
      - {id: ef-cluster01, parent: institute, kind: project, shares: 100, leads: [alice]}
    policy:
      id: flat-2021
      effective_from: 2021-01-01T00:00:00Z
      gpu_type_weights: {V100: 1.00}
      priority_multipliers: {preemptible: 1.00, standard: 1.00, non-preemptible: 1.00}
      interactive_rate: 1.00
    allocations:
      - {project: ef-cluster01, gpu_hours: 1000}
"""
# Inherited variables that would let the dev environment (or another run's settings) leak into the
# installed one. PYTHONDONTWRITEBYTECODE goes too: site-packages must stay unchanged without it.
LEAKY = {
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONSTARTUP",
    "PYTHONUSERBASE",
    "PYTHONDONTWRITEBYTECODE",
    "VIRTUAL_ENV",
    "KAFKA_BOOTSTRAP_SERVERS",
    "XDG_STATE_HOME",
}


# -- helpers ------------------------------------------------------------------------------------


def _tail(path: Path, lines: int = 60) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<no log {path}: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


def _child_env(venv: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """os.environ without the dev virtualenv, the checkout or any ALLMENDE_ setting; the new venv first."""
    env = {
        k: v for k, v in os.environ.items() if k not in LEAKY and not k.startswith(("ALLMENDE_", "COV_CORE_"))
    }
    dev_bin = str(Path(sys.prefix) / "bin")
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != dev_bin]
    env["PATH"] = os.pathsep.join([str(venv / "bin"), *path])
    env["COLUMNS"] = "200"  # rich: one line per command in --help
    return {**env, **(extra or {})}


def _run(argv: list[str], *, env: Mapping[str, str], cwd: Path, timeout: float = 120) -> str:
    """Run a command to its end; its output, or a failure that shows it."""
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}:\n{output[-6000:]}"
    return output


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every directory (`name/`) and file under `root`: relative path -> (size, mtime in ns)."""
    found: dict[str, tuple[int, int]] = {}
    for directory, dirs, files in os.walk(root):
        here = Path(directory).relative_to(root)
        found.update({f"{here / name}/": (0, 0) for name in dirs})
        for name in files:
            info = Path(directory, name).lstat()
            found[str(here / name)] = (info.st_size, info.st_mtime_ns)
    return found


@contextlib.contextmanager
def _started(name: str, argv: list[str], env: Mapping[str, str], cwd: Path, logs: Path) -> Iterator[Child]:
    child = Child(argv, logs / f"{name}.log", env, cwd=cwd, session=True)
    try:
        yield child
    finally:
        child.stop(timeout=45)  # a no-op once the test stopped it; else the test failed before


def _logs(children: Mapping[str, Child]) -> str:
    return "\n".join(
        f"--- {name}, last lines of {c.log_path}:\n{_tail(c.log_path)}" for name, c in children.items()
    )


def _wait(check: Callable[[], T | None], timeout: float, what: str, children: Mapping[str, Child]) -> T:
    """`check()`'s first truthy answer; fails early, with the children's logs, if one of them dies."""

    def alive_and(check_: Callable[[], T | None]) -> T | None:
        if dead := [name for name, c in children.items() if c.died()]:
            raise AssertionError(f"{dead[0]} exited while waiting for {what}\n{_logs(children)}")
        return check_()

    try:
        return wait_until(lambda: alive_and(check), timeout, what, every=0.5)  # type: ignore[return-value]
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{_logs(children)}") from None


def _get(client: httpx.Client, path: str, **kwargs: Any) -> httpx.Response | None:
    try:
        return client.get(path, **kwargs)
    except httpx.HTTPError:
        return None


# -- the wheel and its virtualenv ---------------------------------------------------------------


def _ignore(directory: str, names: list[str]) -> set[str]:
    """What the copy of the checkout leaves out: VCS, virtualenvs, caches, earlier builds, jars."""
    at_root = Path(directory) == REPO
    return {
        n
        for n in names
        if n == "__pycache__"
        or n.endswith(".egg-info")
        or (at_root and (n.startswith(".") or n in ("build", "dist", "infra", "node_modules")))
    }


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    site_packages: Path
    after_install: dict[str, tuple[int, int]]

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    @property
    def allmende(self) -> str:
        return str(self.venv / "bin" / "allmende")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of the checkout (setuptools writes build/ and *.egg-info into
    the tree it builds, and a stale build/lib would end up in the wheel)."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    shutil.copytree(REPO, source, symlinks=True, ignore=_ignore)  # allmende/domain -> ../domain stays a link
    out = root / "dist"
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-q"]
    _run(
        [*build, "-w", str(out), str(source)],
        env={**os.environ},
        cwd=root,
        timeout=300,
    )
    wheels = sorted(out.glob("allmende-*.whl"))
    assert len(wheels) == 1, f"expected one allmende wheel in {out}, found {wheels}"
    return wheels[0]


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """A new virtualenv with the wheel and its dependencies (from PyPI, or pip's cache); removed
    afterwards (over 1 GB; the children's logs stay in the tests' own tmp_path)."""
    root = tmp_path_factory.mktemp("installed")
    venv = root / "venv"
    env = _child_env(venv)
    _run([sys.executable, "-m", "venv", str(venv)], env=env, cwd=root)
    _run(
        [str(venv / "bin" / "pip"), "install", "--disable-pip-version-check", "-q", str(wheel)],
        env=env,
        cwd=root,
        timeout=600,
    )
    [site_packages] = (venv / "lib").glob("python3*/site-packages")
    # pip compiled every module it installed, so running them writes no __pycache__ there: the
    # children run without PYTHONDONTWRITEBYTECODE (see LEAKY) and site-packages must not change.
    yield Installed(wheel, venv, site_packages, _tree(site_packages))
    shutil.rmtree(venv, ignore_errors=True)


# -- the tests ----------------------------------------------------------------------------------


def test_the_wheel_holds_only_the_allmende_package_with_its_data_files(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        sizes = {info.filename: info.file_size for info in archive.infolist()}
    top = {name.split("/", 1)[0] for name in names}
    dist_info = {t for t in top if t.endswith(".dist-info")}
    assert len(dist_info) == 1 and top - dist_info == {"allmende"}, sorted(top)

    web = "allmende/services/web"
    assert sizes.get(f"{web}/static/vendor/echarts.min.js", 0) > 500_000, "the vendored ECharts is missing"
    for name in ("base.html", "overview.html", "project.html", "signin.html", "message.html"):
        assert f"{web}/templates/{name}" in names, f"template {name} is missing"
    for name in ("common.js", "overview.js", "project.js", "style.css"):
        assert f"{web}/static/{name}" in names, f"static file {name} is missing"
    ddl = sorted(n for n in names if n.startswith("allmende/schemas/clickhouse/") and n.endswith(".sql"))
    in_checkout = sorted(p.name for p in (REPO / "schemas" / "clickhouse").glob("*.sql"))
    assert [n.rsplit("/", 1)[1] for n in ddl] == in_checkout and ddl, "ClickHouse migrations missing"
    # Every module of the checkout's package is in the wheel (the symlinked folders included).
    modules = {
        str(Path("allmende", *p.relative_to(REPO / "allmende").parts))
        for p in (REPO / "allmende").rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert modules - set(names) == set(), "modules missing from the wheel"


def test_the_installed_command_line_answers_outside_the_checkout(
    installed: Installed, tmp_path: Path
) -> None:
    env = _child_env(installed.venv, {"ALLMENDE_STATE_DIR": str(tmp_path / "state")})
    for argv in (["allmende", "--help"], [installed.python, "-m", "allmende", "--help"]):
        output = _run(argv, env=env, cwd=tmp_path)
        for command in ("worker", "serve", "replay", "budget", "usage", "migrate"):
            assert command in output, f"{' '.join(argv)} does not list {command}:\n{output}"
    where = _run([installed.python, "-c", "import allmende; print(allmende.__file__)"], env=env, cwd=tmp_path)
    assert Path(where.strip()).is_relative_to(installed.site_packages), where
    assert not (tmp_path / "state").exists() and not (tmp_path / ".allmende").exists()


def test_the_installed_platform_meters_a_replayed_trace_and_serves_its_pages(
    installed: Installed, kafka_bootstrap: str, elasticflow_tarball: Path, tmp_path: Path
) -> None:
    work = tmp_path / "work"  # the children's working directory: outside the checkout
    logs = tmp_path / "logs"
    state = tmp_path / "state"
    work.mkdir()
    logs.mkdir()
    tag = uuid.uuid4().hex[:10]
    secret = f"admin-{uuid.uuid4().hex}"
    port = free_port()
    env = _child_env(
        installed.venv,
        {
            "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
            "ALLMENDE_STATE_DIR": str(state),
            "ALLMENDE_TOPIC_PREFIX": f"pkg{tag}",
            "ALLMENDE_TOPIC_PARTITIONS": "4",
            "ALLMENDE_METER_APP_ID": f"pkg{tag}-meter",
            "ALLMENDE_WRITER_GROUP": f"pkg{tag}-writer",
            "ALLMENDE_METER_METRICS_PORT": str(free_port()),
            "ALLMENDE_ADMIN_TOKENS": f"admin:{secret}",
            "ALLMENDE_TOKEN": secret,  # the command line's own token (`allmende budget apply`)
            "ALLMENDE_LOG_JSON": "false",
            "ALLMENDE_API_PORT": str(port),
            "ALLMENDE_WRITE_TIMEOUT_MS": "3000",  # a loaded test machine: no 503 for a slow ack
        },
    )
    jobs = list(read_trace(elasticflow_tarball, TraceFormat.ELASTICFLOW, cluster=CLUSTER, limit=JOBS))
    assert len(jobs) == JOBS and {j.project for j in jobs} == {PROJECT}
    expected_gpu_seconds = sum(j.gpu_seconds for j in jobs)
    base = f"http://127.0.0.1:{port}"
    admin = {"Authorization": f"Bearer {secret}"}

    with (
        _started("api", [installed.allmende, "serve", "--port", str(port)], env, work, logs) as api,
        _started("worker", [installed.allmende, "worker"], env, work, logs) as worker,
        httpx.Client(base_url=base, timeout=30) as client,
    ):
        children = {"api": api, "worker": worker}

        def healthy() -> bool:
            response = _get(client, "/healthz")
            return response is not None and response.status_code == 200

        _wait(healthy, 120, "the API's /healthz", children)

        plan = work / "plan.yaml"
        plan.write_text(textwrap.dedent(PLAN))
        applied = _run([installed.allmende, "budget", "apply", str(plan)], env=env, cwd=work)
        assert "changes applied" in applied, applied

        replay = [installed.allmende, "replay", str(elasticflow_tarball), "--format", "elasticflow"]
        replayed = _run(
            [*replay, "--cluster", CLUSTER, "--limit", str(JOBS)],
            env=env,
            cwd=work,
            timeout=180,
        )
        assert f"{JOBS} jobs" in replayed, replayed

        def metered() -> dict[str, Any] | None:
            response = _get(client, f"/v1/projects/{PROJECT}/balance", headers=admin)
            if response is None or response.status_code != 200:
                return None
            body: dict[str, Any] = response.json()
            return body if body["total_gpu_seconds"] == expected_gpu_seconds else None

        balance = _wait(metered, 120, f"{expected_gpu_seconds:,} GPU-seconds in the balance", children)
        expected_units = expected_gpu_seconds * CHARGE_UNITS_PER_GPU_SECOND  # every factor 1.00
        assert balance["total_charged_units"] == expected_units, balance
        assert balance["over_budget_units"] == 0, balance
        [allocation] = balance["allocations"]
        assert allocation["charged_units"] == expected_units, balance
        assert allocation["allocated_units"] == 1000 * 3600 * CHARGE_UNITS_PER_GPU_SECOND, balance

        health = client.get("/healthz")
        assert health.status_code == 200 and health.json()["status"] == "ok", health.text

        # The pages, as a browser sees them: refused without a session, then the sign-in form's cookie.
        assert client.get("/ui/overview").status_code == 303
        signed_in = client.post("/ui/signin", data={"token": secret})
        assert signed_in.status_code == 303 and "allmende_session" in client.cookies, signed_in.text
        overview = client.get("/ui/overview")
        assert overview.status_code == 200, overview.text
        assert '<script src="/ui/static/vendor/echarts.min.js"></script>' in overview.text, overview.text
        echarts = client.get("/ui/static/vendor/echarts.min.js")
        assert echarts.status_code == 200 and len(echarts.content) > 500_000
        with zipfile.ZipFile(installed.wheel) as archive:
            assert echarts.content == archive.read("allmende/services/web/static/vendor/echarts.min.js")
        client.cookies.clear()

        for child in (worker, api):
            child.stop(timeout=45)  # SIGTERM; SIGKILL after 45 s, which the exit codes below refuse
        stopped = {name: c.proc.returncode for name, c in children.items()}
        assert all(code in (0, -signal.SIGTERM) for code in stopped.values()), (
            f"exit codes after SIGTERM: {stopped}\n{_logs(children)}"
        )

    # All state went to ALLMENDE_STATE_DIR: the embedded ClickHouse, the worker's data; none went
    # into the working directory, and site-packages is file for file what pip installed.
    chdb = state / "chdb"
    assert chdb.is_dir() and any(p.is_file() for p in chdb.rglob("*")), f"no chDB data in {chdb}"
    assert not (work / ".allmende").exists(), "state went to the working directory"
    before, after = installed.after_install, _tree(installed.site_packages)
    added, removed = sorted(set(after) - set(before)), sorted(set(before) - set(after))
    changed = sorted(p for p in set(after) & set(before) if after[p] != before[p])
    assert not (added or removed or changed), (
        f"site-packages changed while running: added {added[:20]}, removed {removed[:20]}, "
        f"changed {changed[:20]}"
    )
