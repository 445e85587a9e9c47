"""An httpx transport over several instances of the same API: each request goes to the instance
that answered last, and on to the next when it cannot be reached or answers 5xx (a follower that
does not decide, a leader that is stopping). What the scheduler's side is given is every instance;
it moves on by itself."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import httpx


class FailoverTransport(httpx.BaseTransport):
    def __init__(self, base_urls: Sequence[str], transport: httpx.BaseTransport | None = None) -> None:
        if not base_urls:
            raise ValueError("no instance to ask")
        self.bases = [httpx.URL(url) for url in base_urls]
        self.inner = transport or httpx.HTTPTransport()
        self._current = 0
        self._lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        with self._lock:
            first = self._current
        failure: Exception | None = None
        response: httpx.Response | None = None
        for step in range(len(self.bases)):
            index = (first + step) % len(self.bases)
            base = self.bases[index]
            request.url = request.url.copy_with(scheme=base.scheme, host=base.host, port=base.port)
            try:
                response = self.inner.handle_request(request)
            except httpx.TransportError as exc:
                failure = exc
                continue
            if response.status_code < 500 or step == len(self.bases) - 1:
                with self._lock:
                    self._current = index
                return response
            response.read()
            response.close()
        if response is not None:
            return response
        assert failure is not None
        raise failure

    def close(self) -> None:
        self.inner.close()
