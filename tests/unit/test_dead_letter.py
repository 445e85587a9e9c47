"""Dead letters always fit on their topic, and the writer refuses per record what the ledger cannot hold."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from allmende.schemas.dead_letter import (
    KEY_PREFIX_MAX,
    REASON_MAX,
    RECORD_MAX_BYTES,
    VALUE_PREFIX_MAX,
    DeadLetter,
)
from allmende.schemas.ledger import LedgerEntry, encode_entries
from allmende.streams.ledger_writer import postable_entries

ROOT = Path(__file__).resolve().parents[2]
BROKER_LIMIT = 1_000_000  # faust's producer_max_request_size, the smallest limit on the way


def _letter(
    value: bytes | None, key: bytes | None = b"job-1", reason: str = "contract violation"
) -> DeadLetter:
    return DeadLetter.of(
        stage="meter", reason=reason, topic="t.job-events", partition=3, offset=41, key=key, value=value
    )


def test_a_900_kb_value_gives_a_letter_well_under_a_megabyte_with_its_length_and_hash() -> None:
    value = b'{"producer": "' + b"x" * 900_000 + b'"}'

    letter = _letter(value)
    record = letter.to_json()

    assert len(record) < 100_000 < BROKER_LIMIT
    assert letter.truncated
    assert letter.value_length == len(value)
    assert letter.value_sha256 == hashlib.sha256(value).hexdigest()
    assert letter.value_prefix() == value[:VALUE_PREFIX_MAX]
    assert (letter.source_topic, letter.source_partition, letter.source_offset) == ("t.job-events", 3, 41)
    with pytest.raises(ValueError, match="first 65536 of 900016 bytes"):
        letter.original_value()
    # What the topic carries reads back as the same letter.
    assert DeadLetter.model_validate_json(record) == letter


def test_a_small_value_is_kept_whole() -> None:
    letter = _letter(b"{not json")

    assert not letter.truncated
    assert letter.original_value() == b"{not json"
    assert letter.value_length == 9 and letter.key_length == 5
    assert base64.b64decode(letter.key_b64 or "") == b"job-1"


def test_a_value_of_exactly_the_prefix_is_not_truncated() -> None:
    value = os.urandom(VALUE_PREFIX_MAX)
    assert _letter(value).original_value() == value
    assert _letter(value + b"!").truncated


def test_the_worst_case_letter_stays_under_its_documented_bound() -> None:
    # Every field at its longest, in the characters JSON escapes the most (a control character
    # is six bytes, `\u001f`) and a lone surrogate, which UTF-8 cannot carry as such.
    worst = "\udcff" + "\x1f" * 5_000
    letter = DeadLetter.of(
        stage=worst, reason=worst, topic=worst, partition=2**31 - 1, offset=2**63 - 1,
        key=os.urandom(1_000_000), value=os.urandom(1_000_000),
    )  # fmt: skip

    record = letter.to_json()

    assert len(record) <= RECORD_MAX_BYTES
    assert len(letter.reason) == REASON_MAX and letter.reason.endswith("[... 5006 characters in all]")
    assert letter.reason.startswith("\\udcff\x1f")  # the surrogate written out
    assert letter.key_length == 1_000_000
    assert len(base64.b64decode(letter.key_b64 or "")) == KEY_PREFIX_MAX
    assert DeadLetter.model_validate_json(record) == letter


def test_no_key_and_no_value_are_letters_too() -> None:
    letter = _letter(None, key=None)

    assert letter.key_b64 is None and letter.key_length is None
    assert letter.value_length == 0 and letter.original_value() == b""


def test_a_letter_written_before_the_bounds_still_reads() -> None:
    old = {
        "stage": "meter", "reason": "r", "source_topic": "t", "source_partition": 0, "source_offset": 1,
        "key_b64": None, "value_b64": base64.b64encode(b"{oops").decode(), "refused_at": 1,
    }  # fmt: skip

    letter = DeadLetter.model_validate_json(orjson.dumps(old))

    assert letter.original_value() == b"{oops" and letter.value_sha256 is None


# -- the ledger writer's input -------------------------------------------------------------------

T0 = 1_767_225_600


def _entry_dict(**change: object) -> dict[str, object]:
    entry = LedgerEntry(
        entry_id="e1", job_id="job-1", version=5, interval_start=T0, interval_end=T0 + 600, gpus=8,
        project="p", user="u", cluster="c", gpu_type="a100", priority_class="standard",
        interactive=False, source_event_id="ev-2", pred_event_id="ev-1",
    )  # fmt: skip
    data: dict[str, object] = orjson.loads(encode_entries([entry]))[0]
    data.update(change)
    return data


def test_the_writer_takes_what_the_meter_writes() -> None:
    value = orjson.dumps([_entry_dict(), _entry_dict(entry_id="e2", utilization_bp=0)])
    assert [e.entry_id for e in postable_entries(value)] == ["e1", "e2"]


@pytest.mark.parametrize(
    "change",
    [
        {"gpus": True},  # a bool is no count
        {"gpus": 8.0},
        {"interactive": 1},
        {"project": None},
        {"interval_start": "1767225600", "interval_end": "1767226200"},  # strings compare too
        {"utilization_bp": 5000.5},
        {"interval_end": 10**12},  # past what a ClickHouse Date holds
        {"interval_start": -5},
        {"gpus": 10**9},  # gpu_seconds x 10,000 would overflow Int64
        {"version": 2**64},
        {"gpus": -1},
        {"interval_end": T0 - 1},
    ],
)
def test_the_writer_refuses_an_entry_the_ledger_cannot_hold(change: dict[str, object]) -> None:
    with pytest.raises((ValueError, TypeError)):
        postable_entries(orjson.dumps([_entry_dict(), _entry_dict(**change)]))


@pytest.mark.parametrize("value", [None, b"", b"\xff\xfe", b"{}", b"[1]", b'[{"entry_id": "x"}]', b"[[]]"])
def test_the_writer_refuses_what_is_no_ledger_entry(value: bytes | None) -> None:
    with pytest.raises((ValueError, TypeError)):
        postable_entries(value)


def test_a_burst_of_entries_is_split_into_records_the_producer_takes() -> None:
    # In a fresh interpreter: importing the meter imports faust, which picks its loop once.
    code = (
        "from allmende.schemas.ledger import LedgerEntry, decode_entries\n"
        "from allmende.streams.meter import ENTRY_RECORD_MAX_BYTES, entry_records\n"
        "es = [LedgerEntry(entry_id=f'e{i:05}', job_id='j' * 200, version=i, interval_start=1_800_000_000,"
        " interval_end=1_800_000_600, gpus=8, project='p' * 200, user='u' * 200, cluster='c', gpu_type='g',"
        " priority_class='standard', interactive=False, source_event_id='s' * 200, pred_event_id='q' * 200)"
        " for i in range(5_000)]\n"
        "records = entry_records(es)\n"
        "print(len(records) > 1, max(map(len, records)) <= ENTRY_RECORD_MAX_BYTES,"
        " [e for r in records for e in decode_entries(r)] == es, len(entry_records(es[:3])))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.stdout.strip() == "True True True 1", done.stderr


def test_the_meter_sends_again_what_the_broker_did_not_take_and_gives_up_only_on_a_lasting_refusal() -> None:
    # In a fresh interpreter, as above. A producer whose first delivery of every record times out
    # (a broker away longer than the request timeout) and whose sends are sometimes refused at once.
    code = """
import asyncio
from types import SimpleNamespace
from aiokafka.errors import KafkaTimeoutError, MessageSizeTooLargeError
from faust.exceptions import ProducerSendError
import allmende.streams.meter as m

m.RESEND_FIRST_S = 0.001

class Producer:
    def __init__(self, refuse=None):
        self.sends, self.refuse = [], refuse
    async def send(self, topic, key, value, **_):
        self.sends.append(value)
        if self.refuse is not None:
            raise ProducerSendError("refused") from self.refuse
        future = asyncio.get_running_loop().create_future()
        if self.sends.count(value) == 1:
            future.set_exception(KafkaTimeoutError())
        elif self.sends.count(value) == 2 and value == b"b":
            raise ProducerSendError("no metadata") from KafkaTimeoutError()
        else:
            future.set_result(None)
        return future

async def main():
    producer = Producer()
    out = m._Deliveries(SimpleNamespace(producer=producer))
    out.send("t", None, b"a"); out.send("t", b"k", b"b")
    await out.delivered()
    print(sorted(producer.sends))
    for refuse in (MessageSizeTooLargeError(), ):
        out = m._Deliveries(SimpleNamespace(producer=Producer(refuse)))
        out.send("t", None, b"a")
        try:
            await out.delivered()
        except ProducerSendError as exc:
            print("gave up", type(exc.__cause__).__name__)

asyncio.run(main())
"""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    printed = [line for line in done.stdout.splitlines() if "meter_send_failed" not in line]  # logs
    assert done.stdout.count("meter_send_failed") == 3  # a's and b's timeouts, b's refused resend
    assert printed == [
        "[b'a', b'a', b'b', b'b', b'b']",
        "gave up MessageSizeTooLargeError",
    ], done.stderr
