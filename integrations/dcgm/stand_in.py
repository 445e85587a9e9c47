"""A dcgm-exporter stand-in: a recorded real scrape, served for a node of any number of GPUs with
the exporter's Slurm job mapping (for tests and `make slurm-demo`, where no GPU is).

The recorded scrape (../shared/data/dcgm) holds one GPU's series. `exporter_text` copies them for
each GPU (its index in `gpu`, its own UUID) and, as the exporter does with
`--hpc-job-mapping-dir`, emits each series of a GPU once per job on it with `hpc_job` added.
`ExporterStandIn` serves that on `/metrics`, reading the mapping from the same per-GPU files the
prolog writes, so what it says follows the jobs Slurm runs.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from allmende.integrations.dcgm.scrape import UTILIZATION

SERIES = re.compile(r"^(?P<name>DCGM_FI_\w+)\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
UUID = re.compile(r'UUID="([^"]*)"')


def exporter_text(
    recorded: str, jobs: Mapping[int, list[str]], utilization: Mapping[int, float] | None = None
) -> str:
    """`recorded` (one GPU's series, index 0) as a node of GPUs `jobs` names (index -> jobs on it,
    [] for none), each series once per job with `hpc_job`, the GPUs' utilisation from
    `utilization` (percent; the recorded value where not given)."""
    out = []
    for line in recorded.splitlines():
        match = SERIES.match(line)
        if match is None:
            out.append(line)
            continue
        for gpu in sorted(jobs) or [0]:
            labels = match["labels"].replace('gpu="0"', f'gpu="{gpu}"')
            if gpu:
                labels = UUID.sub(lambda m, g=gpu: f'UUID="{m.group(1)[:-2]}{g:02x}"', labels)
            value = match["value"]
            if utilization is not None and gpu in utilization and match["name"] == UTILIZATION:
                value = f"{utilization[gpu]:g}"
            on: list[str | None] = [*jobs.get(gpu, [])] or [None]
            for job in on:
                extra = f',hpc_job="{job}"' if job is not None else ""
                out.append(f"{match['name']}{{{labels}{extra}}} {value}")
    return "\n".join(out) + "\n"


def respond(handler: BaseHTTPRequestHandler, body: bytes, content_type: str = "text/plain") -> None:
    """Answer 200 with `body` (for this stand-in and the tests' other small servers)."""
    handler.send_response(200)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def read_mapping(directory: Path, gpus: int) -> dict[int, list[str]]:
    """The exporter's reading of `--hpc-job-mapping-dir`: a file per GPU index, a job id per line;
    a GPU without a file has no job."""
    found: dict[int, list[str]] = {}
    for index in range(gpus):
        path = directory / str(index)
        try:
            found[index] = [line.strip() for line in path.read_text().splitlines() if line.strip()]
        except (FileNotFoundError, NotADirectoryError):
            found[index] = []
    return found


class ExporterStandIn:
    """Serves `exporter_text` on http://127.0.0.1:<port>/metrics for a node of `gpus` GPUs.

    Jobs come from `mapping_dir` (read at every scrape) or are set with `jobs`; a mapped GPU reads
    `busy_pct` unless its job is in `idle_jobs` (then `idle_pct`); an unmapped one reads
    `free_pct` (set it above 0 for use nobody is charged for)."""

    def __init__(
        self,
        recorded: str,
        gpus: int,
        mapping_dir: Path | None = None,
        *,
        busy_pct: float = 93,
        idle_pct: float = 0,
        free_pct: float = 0,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.recorded, self.gpus, self.mapping_dir = recorded, gpus, mapping_dir
        self.busy_pct, self.idle_pct, self.free_pct = busy_pct, idle_pct, free_pct
        self.jobs: dict[int, list[str]] = {i: [] for i in range(gpus)}
        self.idle_jobs: set[str] = set()
        self.scrapes = 0
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                stand_in.scrapes += 1
                respond(self, stand_in.text().encode(), "text/plain; version=0.0.4")

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="dcgm-stand-in")

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/metrics"

    def text(self) -> str:
        jobs = read_mapping(self.mapping_dir, self.gpus) if self.mapping_dir else self.jobs
        utilization = {
            gpu: (self.idle_pct if set(on) & self.idle_jobs else self.busy_pct) if on else self.free_pct
            for gpu, on in jobs.items()
        }
        return exporter_text(self.recorded, jobs, utilization)

    def start(self) -> ExporterStandIn:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> ExporterStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
