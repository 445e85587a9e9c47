"""A metering worker as a child process (`python -m allmende.streams.meter_worker`), configured
by environment.

Used where one program runs the whole pipeline itself: the simulator's runs, the benchmarks and
the integration tests. `allmende up` starts its long-lived worker through `allmende.core.procs`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from allmende.core.settings import Settings

ROOT = Path(__file__).resolve().parents[1]


def env_for(settings: Settings) -> dict[str, str]:
    """The worker's environment: what makes it read and write `settings`' topics."""
    return {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": settings.kafka_bootstrap_servers,
        "ALLMENDE_TOPIC_PREFIX": settings.topic_prefix,
        "ALLMENDE_TOPIC_PARTITIONS": str(settings.topic_partitions),
        "ALLMENDE_METER_APP_ID": settings.meter_app_id,
        "ALLMENDE_METER_DATA_DIR": str(settings.meter_data_dir),
        "ALLMENDE_LOG_LEVEL": "INFO",
        "ALLMENDE_LOG_JSON": "false",
    }


class MeterProcess:
    """One `allmende.streams.meter_worker` process, its output in a log file of its own."""

    def __init__(self, settings: Settings, log_dir: Path, name: str = "meter", metrics_port: int = 0) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"{name}-{time.monotonic_ns()}.log"
        self._log = self.log_path.open("wb")
        self.metrics_port = metrics_port  # 0: none (several workers of one run would share one)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "allmende.streams.meter_worker"],
            cwd=ROOT,
            env={**env_for(settings), "ALLMENDE_METER_METRICS_PORT": str(metrics_port)},
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def died(self) -> bool:
        return self.proc.poll() is not None

    def ready(self) -> bool:
        return b"Worker ready" in self.log_path.read_bytes()

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready():
            if self.died():
                raise RuntimeError(f"meter worker exited: {self.log_path.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"meter worker not ready after {timeout:.0f}s ({self.log_path})")
            time.sleep(0.1)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(30)
        self._log.close()

    def stop(self) -> None:
        self.kill(signal.SIGTERM)
