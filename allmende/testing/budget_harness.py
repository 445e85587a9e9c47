"""Running the API process (with its in-process ledger writer) against real Kafka and chDB."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.testclient import TestClient

from allmende.core.settings import Settings
from allmende.services.admin_service import AdminService
from allmende.topology import create_app

ADMIN = {"Authorization": "Bearer admin-secret"}
ALICE = {"Authorization": "Bearer alice-secret"}
BOB = {"Authorization": "Bearer bob-secret"}
SCHEDULER = {"Authorization": "Bearer sched-secret"}


def with_tokens(settings: Settings) -> Settings:
    return settings.model_copy(
        update={
            "admin_tokens": "root:admin-secret",
            "lead_tokens": "alice:alice-secret,bob:bob-secret",
            "scheduler_tokens": "slurm:sched-secret",
            "submit_tokens": "cli:submit-secret",
        }
    )


class FakeClock:
    """The service's clock, set by the test: admin events get the instants the scenario needs."""

    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> float:
        return float(self.now)


def set_clock(app: FastAPI, clock: FakeClock) -> None:
    """The admin and admission services read the test's clock."""
    admin: AdminService = app.state.admin
    admin.clock = clock
    if app.state.admission is not None:
        app.state.admission.clock = clock


@contextmanager
def running_api(settings: Settings, now: int) -> Iterator[tuple[TestClient, FakeClock]]:
    clock = FakeClock(now)
    with TestClient(create_app(with_tokens(settings))) as client:
        set_clock(client.app, clock)  # type: ignore[arg-type]
        yield client, clock


def ok(response: httpx.Response) -> Any:
    assert response.status_code == 200, f"{response.status_code}: {response.text}"
    return response.json()


def plan_text(body: str) -> str:
    return textwrap.dedent(body).lstrip()


@contextmanager
def live_api(settings: Settings, now: int) -> Iterator[tuple[str, FakeClock]]:
    """The API served by uvicorn on a free loopback port, for clients that speak real HTTP."""
    clock = FakeClock(now)
    app = create_app(with_tokens(settings))
    with serving(app) as url:
        set_clock(app, clock)
        yield url, clock


@contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    """`app` served by uvicorn in a thread on a free loopback port, its lifespan run; the URL."""
    import threading

    import uvicorn

    from allmende.core.kafka_local import free_port

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_config=None))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = 60.0
        while not server.started and deadline > 0:
            thread.join(0.1)
            deadline -= 0.1
        assert server.started, "uvicorn did not start"
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(30)
