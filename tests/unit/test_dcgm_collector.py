"""The DCGM collector against exporters over real HTTP: the recorded L4 scrape served by the
stand-in with a Slurm job mapping, and nodes that fail in each way a node can (no answer in time,
refused, an HTTP error, text that is not Prometheus text). Each failure is reported and publishes
nothing; the nodes that answered are published as they are; records Kafka did not take are sent
again with the next round."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from allmende.core.kafka_local import free_port
from allmende.integrations.dcgm.collector import Collector, Target
from allmende.integrations.dcgm.scrape import parse_scrape
from allmende.integrations.dcgm.stand_in import ExporterStandIn, respond
from allmende.schemas.gpu_samples import GpuSamples, parse_gpu_samples

DCGM = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "dcgm"
L4 = DCGM / "l4-gpu-operator.prom"
HOSTNAME = "i-030791dc5a37cd257"  # the recorded scrape's Hostname label

pytestmark = pytest.mark.skipif(not L4.exists(), reason="the recorded scrapes are not here")


@pytest.fixture
def node() -> Iterator[ExporterStandIn]:
    """8 GPUs: job 4101 on 0-3 (busy), 4102 on 4-5 (idle), 4102 and 4103 sharing 6, 7 free."""
    with ExporterStandIn(L4.read_text(), 8, busy_pct=93, idle_pct=1) as stand_in:
        stand_in.jobs.update({0: ["4101"], 1: ["4101"], 2: ["4101"], 3: ["4101"], 4: ["4102"], 5: ["4102"]})
        stand_in.jobs[6] = ["4102", "4103"]
        stand_in.idle_jobs.add("4102")
        yield stand_in


class _Broken(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path.startswith("/error"):
            self.send_error(500, "exporter failed")
            return
        body = b'DCGM_FI_DEV_GPU_UTIL{gpu="0" 0\n'  # a label set never closed
        respond(self, body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def broken() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Broken)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def silent() -> Iterator[str]:
    """Accepts connections and never answers (a hung exporter)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/metrics"
    listener.close()


def _by_job(records: Sequence[GpuSamples]) -> dict[str | None, dict[int, int]]:
    return {r.job_id: {s.gpu: s.utilization_bp for s in r.gpus} for r in records}


def test_each_gpu_is_published_under_each_job_on_it_with_its_reading(node: ExporterStandIn) -> None:
    collector = Collector([Target.parse(node.url)], interval_s=30, clock=lambda: 1_800_000_000.7)
    done = collector.round()
    assert [r.outcome for r in done.reads] == ["ok"] and not done.failed
    assert _by_job(done.records) == {
        "4101": {0: 9300, 1: 9300, 2: 9300, 3: 9300},
        "4102": {4: 100, 5: 100, 6: 100},
        "4103": {6: 100},  # the GPU it shares with an idle job reads as that GPU does
        None: {7: 0},  # free
    }
    first = done.records[0]
    assert (first.node, first.occurred_at, first.interval_s) == (HOSTNAME, 1_800_000_000, 30)
    assert first.event_id == f"dcgm/{HOSTNAME}/1800000000/4101" and first.key == b"4101"
    assert first.gpus[0].power_mw == 16_365 and first.gpus[0].fb_used_mib is not None
    assert next(r for r in done.records if r.job_id is None).key == f"node/{HOSTNAME}".encode()
    assert done.samples == 9 and done.free_gpus(HOSTNAME) == 1 and done.unaccounted_gpus(HOSTNAME) == 0
    collector.close()


def test_a_busy_gpu_with_no_job_is_unaccounted_use(node: ExporterStandIn) -> None:
    node.free_pct = 64
    collector = Collector([Target.parse(f"gpu-a07={node.url}")])
    done = collector.round()
    assert done.reads[0].node == "gpu-a07"  # a name given wins over the exporter's Hostname
    assert done.unaccounted_gpus("gpu-a07") == 1 and done.free_gpus("gpu-a07") == 0
    assert _by_job(done.records)[None] == {7: 6400}
    collector.close()


def test_a_node_that_fails_is_reported_and_publishes_nothing_the_others_stand(
    node: ExporterStandIn, broken: str, silent: str
) -> None:
    refused = f"http://127.0.0.1:{free_port()}/metrics"
    targets = [node.url, f"{broken}/error/metrics", f"{broken}/metrics", silent, refused]
    sent: list[GpuSamples] = []
    collector = Collector([Target.parse(t) for t in targets], timeout_s=1.0, publish=sent.extend)
    done = collector.round()
    outcomes = {r.target: r.outcome for r in done.reads}
    assert outcomes == {
        node.url: "ok",
        f"{broken}/error/metrics": "http-error",
        f"{broken}/metrics": "unparsable",
        silent: "timeout",
        refused: "unreachable",
    }
    assert {r.target for r in done.failed} == set(targets) - {node.url}
    assert all(r.error for r in done.failed)
    assert {r.node for r in sent} == {HOSTNAME}  # nothing for a node not read: never read as idle
    assert len(sent) == len(done.records) == 4
    collector.close()


def test_records_kafka_did_not_take_are_sent_again_with_the_next_round(node: ExporterStandIn) -> None:
    sent: list[GpuSamples] = []
    kafka_up = [False]

    def publish(records: Sequence[GpuSamples]) -> None:
        if not kafka_up[0]:
            raise ConnectionError("Kafka away")
        sent.extend(records)

    instants = iter([1_800_000_000, 1_800_000_030])
    collector = Collector([Target.parse(node.url)], publish=publish, clock=lambda: next(instants))
    first = collector.round()
    assert sent == [] and collector.pending == len(first.records) == 4
    kafka_up[0] = True
    second = collector.round()
    assert collector.pending == 0
    assert [r.event_id for r in sent] == [r.event_id for r in first.records + second.records]
    assert {r.occurred_at for r in sent} == {1_800_000_000, 1_800_000_030}
    collector.close()


def test_the_records_are_the_contract_they_name(node: ExporterStandIn) -> None:
    from allmende.schemas.gpu_samples import encode_gpu_samples

    collector = Collector([Target.parse(node.url)])
    for record in collector.round().records:
        assert parse_gpu_samples(encode_gpu_samples(record)) == record
        decoded = json.loads(encode_gpu_samples(record))
        assert decoded["type"] == "GpuSamples" and decoded["schema_version"] == 1
    collector.close()


class _Prometheus(BaseHTTPRequestHandler):
    """Prometheus's instant-query API (`/api/v1/query`), answering from the stand-in's scrape."""

    exporter_text = ""

    def do_GET(self) -> None:
        from urllib.parse import parse_qs, urlsplit

        from prometheus_client.parser import text_string_to_metric_families

        query = parse_qs(urlsplit(self.path).query)["query"][0]
        families = text_string_to_metric_families(self.exporter_text)
        result = [_series(s.name, s.labels, s.value) for f in families for s in f.samples if s.name == query]
        body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
        respond(self, body, "application/json")

    def log_message(self, *args: object) -> None:
        pass


def _series(name: str, labels: dict[str, str], value: float) -> dict[str, object]:
    metric = {**labels, "__name__": name, "instance": "10.0.0.7:9400"}
    return {"metric": metric, "value": [1_800_000_015.2, str(value)]}


def test_a_prometheus_server_that_scrapes_the_exporters_gives_the_same_records(node: ExporterStandIn) -> None:
    _Prometheus.exporter_text = node.text()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Prometheus)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        direct = Collector([Target.parse(node.url)], clock=lambda: 1_800_000_015).round()
        through = Collector(prometheus=f"http://127.0.0.1:{server.server_address[1]}").round()
    finally:
        server.shutdown()
        server.server_close()
    assert through.at == 1_800_000_015  # the server's evaluation instant
    assert _by_job(through.records) == _by_job(direct.records)
    assert {r.node for r in through.records} == {HOSTNAME}


def test_the_stand_in_follows_the_mapping_files_the_prolog_writes(tmp_path: Path) -> None:
    (tmp_path / "1").write_text("77\n")
    (tmp_path / "2").write_text("77\n78\n")
    with ExporterStandIn(L4.read_text(), 4, tmp_path) as stand_in:
        scrape = parse_scrape(stand_in.text(), "n")
        assert {job: [g.gpu for g in gpus] for job, gpus in scrape.jobs().items()} == {
            "77": [1, 2],
            "78": [2],
        }
        (tmp_path / "2").unlink()
        assert list(parse_scrape(stand_in.text(), "n").jobs()) == ["77"]
