"""One scrape of NVIDIA's dcgm-exporter (`/metrics`, Prometheus text) -> each GPU's readings and
the jobs on it.

The exporter labels every series of a GPU with its index (`gpu`) and UUID. It maps GPUs to jobs
itself: on a Slurm node started with `--hpc-job-mapping-dir`, each of a GPU's series is emitted
once per job on it, with `hpc_job="<job id>"` added (several jobs on one GPU: several series, the
same value); under Kubernetes with its pod mapping, the series carry `namespace` and `pod` (the
job is `<namespace>/<pod>`). A GPU with neither is unmapped: free, or busy with no job on it
(unaccounted use, worth an alert, never charged to anyone).

The text is parsed by the Prometheus client's own parser. Text it cannot parse is a
`ScrapeError`: the node is reported as unreadable, never read as idle. A series without a usable
`gpu` label is skipped with a problem noted; the rest of the scrape stands.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

UTILIZATION = "DCGM_FI_DEV_GPU_UTIL"  # percent, 0-100
FB_USED = "DCGM_FI_DEV_FB_USED"  # framebuffer memory used, MiB
POWER = "DCGM_FI_DEV_POWER_USAGE"  # watts
READ = (UTILIZATION, FB_USED, POWER)


class ScrapeError(ValueError):
    """The scrape's text is not Prometheus text: nothing of the node can be read from it."""


@dataclass(frozen=True)
class GpuReading:
    gpu: int  # the GPU's index on its node
    uuid: str | None
    jobs: tuple[str, ...]  # the jobs on it, sorted; () unmapped
    utilization_pct: int | None  # None: the exporter did not report it
    fb_used_mib: int | None = None
    power_mw: int | None = None

    @property
    def unaccounted(self) -> bool:
        """Busy with no job on it: use nobody can be charged for."""
        return not self.jobs and (self.utilization_pct or 0) > 0


@dataclass(frozen=True)
class NodeScrape:
    node: str
    gpus: tuple[GpuReading, ...]  # by index
    problems: tuple[str, ...] = ()  # series skipped, and why
    hostname: str | None = None  # the exporter's own `Hostname` label, where it sets one

    def jobs(self) -> dict[str, tuple[GpuReading, ...]]:
        """Each job on the node, with the readings of its GPUs."""
        found: dict[str, list[GpuReading]] = {}
        for reading in self.gpus:
            for job in reading.jobs:
                found.setdefault(job, []).append(reading)
        return {job: tuple(readings) for job, readings in sorted(found.items())}


@dataclass
class _Gpu:
    uuid: str | None = None
    jobs: set[str] = field(default_factory=set)
    values: dict[str, float] = field(default_factory=dict)


def parse_scrape(text: str, node: str) -> NodeScrape:
    """The readings of every GPU the scrape reports, with the jobs the exporter mapped to each."""
    try:
        samples = [
            (s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples
        ]
    except (ValueError, IndexError, KeyError) as exc:  # the parser's ways of saying "not Prometheus text"
        raise ScrapeError(f"node {node}: the scrape is not Prometheus text ({exc})") from exc
    return readings_of(samples, node)


def readings_of(samples: Iterable[tuple[str, dict[str, str], float]], node: str) -> NodeScrape:
    """A node's GPUs from its series (name, labels, value): a scrape's, or a Prometheus server's
    answer for the node."""
    gpus: dict[int, _Gpu] = {}
    problems: list[str] = []
    hostname: str | None = None
    for name, labels, value in samples:
        if not name.startswith("DCGM_FI_"):
            continue
        hostname = hostname or labels.get("Hostname") or labels.get("hostname")
        index = _index(labels.get("gpu"))
        if index is None:
            problems.append(f"{name}: no GPU index (label gpu={labels.get('gpu')!r}); skipped")
            continue
        gpu = gpus.setdefault(index, _Gpu())
        gpu.uuid = gpu.uuid or labels.get("UUID")
        gpu.jobs.update(_jobs_of(labels))
        if name in READ:
            if math.isnan(value) or value < 0:
                problems.append(f"{name} of GPU {index}: {value} is no reading; skipped")
                continue
            gpu.values[name] = value
    readings = tuple(_reading(index, gpus[index]) for index in sorted(gpus))
    return NodeScrape(node, readings, tuple(problems), hostname)


def _index(label: str | None) -> int | None:
    if label is None or not label.isdigit():
        return None
    return int(label)


def _jobs_of(labels: dict[str, str]) -> Iterable[str]:
    job = labels.get("hpc_job", "").strip()
    if job:
        return (job,)
    namespace, pod = labels.get("namespace", "").strip(), labels.get("pod", "").strip()
    if namespace and pod:
        return (f"{namespace}/{pod}",)
    return ()


def _reading(index: int, gpu: _Gpu) -> GpuReading:
    values = gpu.values
    util = values.get(UTILIZATION)
    fb = values.get(FB_USED)
    power = values.get(POWER)
    return GpuReading(
        gpu=index,
        uuid=gpu.uuid,
        jobs=tuple(sorted(gpu.jobs)),
        utilization_pct=min(100, round(util)) if util is not None else None,
        fb_used_mib=round(fb) if fb is not None else None,
        power_mw=round(power * 1000) if power is not None else None,
    )
