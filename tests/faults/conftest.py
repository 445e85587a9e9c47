"""Fixtures of the fault tests: a broker of the test's own, to stop and start at will."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from allmende.core.kafka_local import LocalBroker, free_port


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[LocalBroker]:
    own = LocalBroker(tmp_path / "kafka", port=free_port(), controller_port=free_port())
    own.start()
    try:
        yield own
    finally:
        own.stop()
