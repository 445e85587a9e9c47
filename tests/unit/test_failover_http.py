"""The scheduler's side given every instance moves on by itself: a refused connection or a 5xx
sends the request to the next instance, which then gets the following requests first."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from allmende.core.failover_http import FailoverTransport
from allmende.core.kafka_local import free_port


@contextlib.contextmanager
def instance(status: int, name: str) -> Iterator[tuple[str, list[str]]]:
    """A real HTTP server answering every request with `status` and its name; the paths it saw."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", 0))
            self.rfile.read(length)
            seen.append(self.path)
            body = name.encode()
            self.send_response(status)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def _client(urls: list[str]) -> httpx.Client:
    return httpx.Client(base_url=urls[0], transport=FailoverTransport(urls), timeout=5)


def test_a_dead_instance_and_a_refusing_one_are_passed_over_and_the_next_request_goes_straight_on() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with (
        instance(503, "follower") as (follower, follower_saw),
        instance(200, "leader") as (leader, leader_saw),
        _client([dead, follower, leader]) as client,
    ):
        first = client.post("/v1/admission?dry_run=true", json={"job_id": "a"})
        second = client.post("/v1/admission", json={"job_id": "b"})
    assert (first.status_code, first.text, second.text) == (200, "leader", "leader")
    assert follower_saw == ["/v1/admission?dry_run=true"]  # asked once; the leader kept the next
    assert leader_saw == ["/v1/admission?dry_run=true", "/v1/admission"]


def test_when_every_instance_refuses_the_last_answer_is_returned_and_none_answering_raises() -> None:
    with instance(503, "one") as (one, _), instance(502, "two") as (two, _), _client([one, two]) as client:
        answer = client.post("/v1/admission", json={})
    assert (answer.status_code, answer.text) == (502, "two")
    nobody = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
    with _client(nobody) as client, pytest.raises(httpx.ConnectError):
        client.post("/v1/admission", json={})
