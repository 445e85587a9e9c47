"""GPU utilisation measured by the GPUs themselves (dcgm-exporter samples, issue 24), as the ledger
keeps it: one row per job, node and scrape whose GPUs were under the squatting cap.

A sample record (`schemas/gpu_samples.py`) stands for the scrape period before it: a row covers
(occurred_at - interval_s, occurred_at] with the job's GPUs on that node and their mean
utilisation. Only rows under `LOW_CAP_BP` are kept (the squatting threshold may not exceed it):
a missing row reads as busy, exactly as a piece missing from `low_pieces` does, so the firehose
costs the ledger only what is idle. A row's identity is (job, node, end): a sample written twice
is the same row, in any order.

Rows carry the job alone. Its project, user and cluster are the job's `JobAttribution` (the meter
emits one from the job's JobSubmitted), joined when the rows are read: a sample never waits for
its job's submission, and nothing that reads the firehose needs the job's state
(streams/sample_writer.py).

Samples never change what a job is charged; they only judge its time. A job with rows is judged
by them alone (its scheduler-sent readings, if any, are not mixed in: two sources of one span
would overlap); its totals and charge stay the ledger's.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from allmende.domain.squatting import JobTotals, UsagePiece
from allmende.schemas.gpu_samples import FULL_BP, MAX_GPUS_PER_NODE, GpuSamples

LOW_CAP_BP = 2_500  # the squatting cap: `low_pieces` keeps the ledger's pieces under it too
# Keys of the payloads the ledger-entry topic carries beside entries (a JSON object, not an array).
ATTRIBUTION_KEY = "attribution"  # {"attribution": [[job, project, user, cluster], ...]}
UTILISATION_KEY = "utilisation"  # rows with their attribution, as meters before 0.x sent them
UNACCOUNTED_KEY = "unaccounted"  # GPUs busy with no job, as the same meters sent them


class IdleRow(NamedTuple):
    """One node's GPUs of one job over one scrape period, under the cap."""

    job_id: str
    node: str
    start: int
    end: int
    gpus: int
    utilization_bp: int


class JobAttribution(NamedTuple):
    """Whose a job's GPU samples are: from its JobSubmitted."""

    job_id: str
    project: str
    user: str
    cluster: str


def mean_bp(record: GpuSamples) -> int:
    """The record's GPUs' mean utilisation, rounded down (integers: the same everywhere)."""
    return sum(s.utilization_bp for s in record.gpus) // len(record.gpus)


def row_of(record: GpuSamples, cap_bp: int = LOW_CAP_BP) -> IdleRow | None:
    """The row a job's sample record makes, or None when its GPUs were busy (at or over the cap)
    or it holds GPUs of no job."""
    if record.job_id is None:
        return None
    bp = mean_bp(record)
    if bp >= cap_bp:
        return None
    end = record.occurred_at
    return IdleRow(record.job_id, record.node, end - record.interval_s, end, len(record.gpus), bp)


class UnaccountedRow(NamedTuple):
    """A node's GPUs busy with no job on them over one scrape period: use nobody is charged for."""

    node: str
    start: int
    end: int
    gpus: int
    utilization_bp: int  # their mean


def unaccounted_of(record: GpuSamples) -> UnaccountedRow | None:
    """The row a record of a node's GPUs with no job makes: those of them that were busy (above
    0, as the collector counts them: `allmende_dcgm_unaccounted_gpus`), or None."""
    if record.job_id is not None:
        return None
    busy = [s.utilization_bp for s in record.gpus if s.utilization_bp > 0]
    if not busy:
        return None
    end = record.occurred_at
    return UnaccountedRow(record.node, end - record.interval_s, end, len(busy), sum(busy) // len(busy))


def encode_attributions(found: Iterable[JobAttribution]) -> dict[str, Any]:
    """A ledger-entry record's payload of job attributions."""
    return {ATTRIBUTION_KEY: [list(a) for a in found]}


def encode_rows(rows: Iterable[Sequence[Any]], unaccounted: Iterable[UnaccountedRow] = ()) -> dict[str, Any]:
    """The payload earlier meters sent: attributed rows ([project, user, cluster] + IdleRow's fields) and rows
    of unaccounted use, if any. Kept for tests of the replay path."""
    payload: dict[str, Any] = {UTILISATION_KEY: [r if isinstance(r, list) else list(r) for r in rows]}
    found = [list(r) for r in unaccounted]
    if found:
        payload[UNACCOUNTED_KEY] = found
    return payload


_TYPES = (str, str, str, str, str, int, int, int, int)
_UNACCOUNTED_TYPES = (str, int, int, int, int)
_ATTRIBUTION_TYPES = (str, str, str, str)
_PAYLOAD_KEYS = {ATTRIBUTION_KEY, UTILISATION_KEY, UNACCOUNTED_KEY}


class Decoded(NamedTuple):
    """What one object payload of the ledger-entry topic holds."""

    idle: list[IdleRow]
    attributions: list[JobAttribution]
    unaccounted: list[UnaccountedRow]


def decode_payload(data: Any) -> Decoded:
    """The rows and attributions of one object payload (`encode_attributions`, `encode_rows`),
    each one the ledger can hold; else ValueError saying why."""
    if not isinstance(data, dict) or not data or not data.keys() <= _PAYLOAD_KEYS:
        raise ValueError(
            'an object on the ledger-entry topic is {"attribution": [...]} or'
            ' {"utilisation": [row, ...], "unaccounted": [row, ...]}'
        )
    found = Decoded([], [], [])
    items, others, owners = (data.get(k, []) for k in (UTILISATION_KEY, UNACCOUNTED_KEY, ATTRIBUTION_KEY))
    if not isinstance(items, list) or not isinstance(others, list) or not isinstance(owners, list):
        raise ValueError("rows and attributions are JSON arrays")
    for item in items:
        if not isinstance(item, list) or tuple(map(type, item)) != _TYPES:
            raise ValueError(f"not a utilisation row: {str(item)[:200]}")
        project, user, cluster, *fields = item  # an earlier meter's row: whose it is, then the row
        row = IdleRow(*fields)
        if not (
            0 <= row.start < row.end
            and 0 < row.gpus <= MAX_GPUS_PER_NODE
            and 0 <= row.utilization_bp < LOW_CAP_BP
        ):
            raise ValueError(f"utilisation row out of range: {str(item)[:200]}")
        found.idle.append(row)
        found.attributions.append(JobAttribution(row.job_id, project, user, cluster))
    for item in others:
        if not isinstance(item, list) or tuple(map(type, item)) != _UNACCOUNTED_TYPES:
            raise ValueError(f"not an unaccounted-use row: {str(item)[:200]}")
        other = UnaccountedRow(*item)
        if not (
            0 <= other.start < other.end
            and 0 < other.gpus <= MAX_GPUS_PER_NODE
            and 0 < other.utilization_bp <= FULL_BP
        ):
            raise ValueError(f"unaccounted-use row out of range: {str(item)[:200]}")
        found.unaccounted.append(other)
    for item in owners:
        if not isinstance(item, list) or tuple(map(type, item)) != _ATTRIBUTION_TYPES or not item[0]:
            raise ValueError(f"not a job attribution: {str(item)[:200]}")
        found.attributions.append(JobAttribution(*item))
    return found


def job_pieces(rows: Sequence[tuple[int, int, int, int]], totals: JobTotals) -> list[UsagePiece]:
    """A job's rows, (start, end, gpus, utilization_bp) of each node, as pieces `find_squatting`
    judges: one per scrape period, over the job's GPUs that were under the cap in it (nodes'
    utilisation weighted by their GPUs). A period where only some of its nodes idled is a piece of
    those GPUs: GPUs held idle are squatted whatever the job's other nodes do.

    Charges: the ledger charges the job's time, not its samples; a piece is charged at the job's
    mean rate so far (its charge per GPU-second), rounded down, for the page's idle cost.
    """
    by_period: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0, 0])
    for start, end, gpus, bp in rows:
        acc = by_period[(start, end)]
        acc[0] += gpus
        acc[1] += gpus * bp
    pieces = []
    for (start, end), (gpus, weighted) in sorted(by_period.items()):
        gpu_seconds = gpus * (end - start)
        charge = totals.charge_units * gpu_seconds // totals.gpu_seconds if totals.gpu_seconds > 0 else 0
        pieces.append(UsagePiece(start, end, gpus, weighted // gpus, min(charge, totals.charge_units)))
    return pieces
