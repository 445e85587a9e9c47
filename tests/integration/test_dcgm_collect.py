"""`allmende collect dcgm` as a site runs it, against the real broker: a process of its own
scrapes an exporter stand-in (the recorded L4 scrape as a node of 8 GPUs with the Slurm mapping)
and a node that does not answer, publishes one record per job to `<prefix>.gpu-samples`, keyed by
the job id, and says which node it could not read (exit 1 with --once); `--dry-run` prints the
same records and publishes nothing."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from allmende.core.kafka_local import free_port
from allmende.core.settings import Settings
from allmende.integrations.dcgm.stand_in import ExporterStandIn
from allmende.schemas.gpu_samples import parse_gpu_samples
from allmende.testing.harness import read_topic

pytestmark = pytest.mark.integration

L4 = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "dcgm" / "l4-gpu-operator.prom"


def _collect(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ALLMENDE_", "KAFKA_"))}
    env.update(
        KAFKA_BOOTSTRAP_SERVERS=settings.kafka_bootstrap_servers,
        ALLMENDE_TOPIC_PREFIX=settings.topic_prefix,
        ALLMENDE_TOPIC_PARTITIONS=str(settings.topic_partitions),
        ALLMENDE_LOG_JSON="false",
        COLUMNS="200",
    )
    argv = [sys.executable, "-m", "allmende", "collect", "dcgm", "--once", "--timeout", "1", *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(not L4.exists(), reason="the recorded scrapes are not here")
def test_collect_publishes_a_record_per_job_and_reports_the_node_it_could_not_read(
    settings: Settings, tmp_path: Path
) -> None:
    mapping = tmp_path / "mapping"
    mapping.mkdir()
    for gpu in range(4):
        (mapping / str(gpu)).write_text("5101\n")
    (mapping / "4").write_text("5102\n")
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(4)
    hung_url = f"http://127.0.0.1:{hung.getsockname()[1]}/metrics"
    with ExporterStandIn(L4.read_text(), 8, mapping, busy_pct=88, idle_pct=0) as node, hung:
        node.idle_jobs.add("5102")
        targets = ["--url", f"gpu-b03={node.url}", "--url", f"gpu-b04={hung_url}"]

        dry = _collect(settings, *targets, "--dry-run")
        assert dry.returncode == 1, dry.stderr  # a node not read
        printed = [parse_gpu_samples(line.encode()) for line in dry.stdout.splitlines()]
        assert {r.job_id: len(r.gpus) for r in printed} == {"5101": 4, "5102": 1, None: 3}
        assert "node gpu-b04 not read" in dry.stderr and "timeout" in dry.stderr

        done = _collect(settings, *targets)
        assert done.returncode == 1, done.stdout + done.stderr
        assert "1 of 2 nodes read, 3 records, 8 GPU samples published" in done.stdout, done.stdout
    records = [
        parse_gpu_samples(raw) for raw in read_topic(settings, settings.gpu_samples_topic, 3, timeout=30)
    ]
    assert {r.job_id: {s.gpu: s.utilization_bp for s in r.gpus} for r in records} == {
        "5101": {0: 8800, 1: 8800, 2: 8800, 3: 8800},
        "5102": {4: 0},
        None: {5: 0, 6: 0, 7: 0},
    }
    assert {r.node for r in records} == {"gpu-b03"}  # nothing of the node that did not answer


def test_collect_without_a_target_says_what_to_give() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "allmende", "collect", "dcgm", "--once"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert done.returncode == 2 and "give exporters" in done.stderr
    port = free_port()
    bad = subprocess.run(
        [sys.executable, "-m", "allmende", "collect", "dcgm", "--once", "--url", f"gpu=http://:{port}"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert bad.returncode == 2 and "not an exporter's address" in bad.stderr
