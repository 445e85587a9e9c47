"""What the sample writer makes of a batch of GPU sample records (streams/sample_writer.py): every
record one fate, a row, a count, unaccounted use or a dead letter with its reason."""

from __future__ import annotations

from typing import NamedTuple

from allmende.domain.gpu_utilisation import IdleRow, UnaccountedRow
from allmende.schemas.gpu_samples import GpuSample, GpuSamples, encode_gpu_samples, sample_id
from allmende.streams.sample_writer import rows_of_batch

T0 = 1_800_000_000


class Record(NamedTuple):  # the fields of a consumer record the writer reads
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


def _record(
    offset: int, job: str | None, bps: list[int], node: str = "n1", key: bytes | None = None
) -> Record:
    sample = GpuSamples(
        event_id=sample_id(node, T0, job), occurred_at=T0, producer="t", node=node, job_id=job, interval_s=30,
        gpus=tuple(GpuSample(gpu=i, utilization_bp=bp) for i, bp in enumerate(bps)),
    )  # fmt: skip
    return Record(0, offset, sample.key if key is None else key, encode_gpu_samples(sample))


def test_each_record_gets_one_fate_and_a_bad_one_a_dead_letter_with_its_place() -> None:
    batch = [
        _record(0, "idle", [0, 100, 0, 300]),
        _record(1, "busy", [9_000] * 4),
        _record(2, None, [0, 5_000, 7_000, 0], node="n2"),  # busy GPUs of no job
        _record(3, None, [0] * 4, node="n3"),  # free GPUs: nothing
        _record(4, "idle", [0] * 4, key=b"another-job"),  # keyed by another job than its own
        Record(0, 5, b"x", b"{not json"),
        Record(0, 6, b"x", None),  # a tombstone
    ]
    idle, unaccounted, letters = rows_of_batch(batch, "t.gpu-samples")
    assert idle == [IdleRow("idle", "n1", T0 - 30, T0, 4, 100)]
    assert unaccounted == [UnaccountedRow("n2", T0 - 30, T0, 2, 6_000)]
    assert [(d.stage, d.code, d.source_offset) for d in letters] == [
        ("sample-writer", "contract", o) for o in (4, 5, 6)
    ]
    assert "is not the record's" in letters[0].reason and "tombstone" in letters[2].reason
