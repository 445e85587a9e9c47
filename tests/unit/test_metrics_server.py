"""The /metrics endpoint of workers and writers: served on its port, off at 0, a taken port no crash."""

from __future__ import annotations

import socket

import httpx

from allmende.core.kafka_local import free_port
from allmende.core.metrics import serve_metrics
from allmende.core.settings import Settings


def test_metrics_are_served_on_the_port_given() -> None:
    port = free_port()
    assert serve_metrics(Settings(), "meter", port) == port
    answer = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert answer.status_code == 200 and "python_gc_objects_collected_total" in answer.text


def test_port_zero_serves_nothing() -> None:
    assert serve_metrics(Settings(), "writer", 0) is None


def test_a_taken_port_is_a_warning_not_a_crash() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert serve_metrics(Settings(), "meter", port) is None
