"""GPU samples: what `<prefix>.gpu-samples` carries, the platform's firehose (issue 24).

One record per node, per scrape, per job on the node: the readings of every GPU of that node the
job holds (a node whose 8 GPUs run one job: one record of 8 samples). Keyed by the job id, like
the job events, so a job's samples reach the partition that holds its state; the GPUs of a node
with no job on them come in one record without a job, keyed by the node (free, or unaccounted use
nobody can be charged for). Per-record costs (Kafka, the stream processor) are paid once per node
and job, not once per GPU; lifecycle events stay one record each on the job-events topic.

A sample says how busy a GPU was when the exporter was scraped; it never changes what a job is
charged (the scheduler's lifecycle events do that), only how its time is judged (squatting).
Utilisation is in basis points (10,000 = fully busy), memory in MiB, power in milliwatts:
integers, like every figure the ledger keeps.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from allmende.schemas.events import Identifier, UnixSeconds, encode_event, parse_with

MAX_GPUS_PER_NODE = 64  # a record is one node's: DGX/HGX nodes have 8, the largest 16-72
FULL_BP = 10_000


class GpuSample(BaseModel):
    """One GPU's reading in a scrape."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu: Annotated[int, Field(ge=0, lt=MAX_GPUS_PER_NODE, strict=True)]  # index on its node
    utilization_bp: Annotated[int, Field(ge=0, le=FULL_BP, strict=True)]
    fb_used_mib: Annotated[int, Field(ge=0, strict=True)] | None = None
    power_mw: Annotated[int, Field(ge=0, strict=True)] | None = None


class GpuSamples(BaseModel):
    """A node's GPUs held by one job (or by none), as one scrape read them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["GpuSamples"] = "GpuSamples"
    schema_version: Literal[1] = 1
    event_id: Identifier  # sample_id(...): the same scrape published twice is the same record
    occurred_at: UnixSeconds  # the scrape's instant
    producer: Identifier
    node: Identifier
    job_id: Identifier | None  # None: GPUs with no job on them
    interval_s: Annotated[int, Field(ge=1, le=3600, strict=True)]  # the scrape period it stands for
    gpus: Annotated[tuple[GpuSample, ...], Field(min_length=1, max_length=MAX_GPUS_PER_NODE)]

    @model_validator(mode="after")
    def _one_reading_per_gpu(self) -> GpuSamples:
        indices = [s.gpu for s in self.gpus]
        if len(set(indices)) != len(indices):
            raise ValueError(f"a GPU is read twice in one record: {sorted(indices)}")
        return self

    @property
    def key(self) -> bytes:
        """The record's Kafka key: the job's id (its partition), or the node's for free GPUs."""
        return (self.job_id or f"node/{self.node}").encode()


def sample_id(node: str, occurred_at: int, job_id: str | None) -> str:
    return f"dcgm/{node}/{occurred_at}/{job_id or '-'}"


_adapter: TypeAdapter[GpuSamples] = TypeAdapter(GpuSamples)


def parse_gpu_samples(raw: bytes) -> GpuSamples:
    """Decode one record, or ContractError with a readable reason (for the dead-letter topic)."""
    return parse_with(_adapter, raw)


def encode_gpu_samples(record: GpuSamples) -> bytes:
    return encode_event(record)
