"""The dead-letter record on `allmende.dead-letter`: why a message was refused, and what it was.

A dead letter always fits on the topic, whatever it reports: a refused record may be as large as
the broker takes (1 MB), so the letter keeps the record's place (topic, partition, offset), the
length and SHA-256 of its value, and bounded prefixes, never the whole:

- the value: its first `VALUE_PREFIX_MAX` bytes (64 KiB), base64; `truncated` says there was more
  (`value_length`, `value_sha256` are the whole value's);
- the key: its first `KEY_PREFIX_MAX` bytes (1 KiB), base64, and `key_length`;
- the reason: at most `REASON_MAX` characters (2,000), cut with a marker that says how long it was.

So a letter's JSON is at most `RECORD_MAX_BYTES` (128 KiB; the tests check the worst case), far
under the broker's and the producers' 1 MB, and the whole original is found at its place (topics
are kept forever) and checked by its hash. Letters written before these bounds have no length or
hash (None) and hold the whole value.
"""

from __future__ import annotations

import base64
import hashlib
import time
from typing import Annotated

import orjson
from pydantic import BaseModel, Field

VALUE_PREFIX_MAX = 64 * 1024  # bytes of the refused value kept
KEY_PREFIX_MAX = 1024  # bytes of the refused key kept
REASON_MAX = 2_000  # characters of the reason
STAGE_MAX = 64
CODE_MAX = 64
TOPIC_MAX = 249  # Kafka's own limit on a topic name
RECORD_MAX_BYTES = 128 * 1024  # a letter's JSON never exceeds this


def _b64_length(n: int) -> int:
    return 4 * ((n + 2) // 3)


class DeadLetter(BaseModel):
    stage: Annotated[str, Field(max_length=STAGE_MAX)]  # who refused it: "meter", "ledger-writer", ...
    reason: Annotated[str, Field(max_length=REASON_MAX)]
    # What kind of refusal, for listing and re-driving by kind: "contract", "conflict",
    # "unknown-project", "over-capacity", ... ("" in letters written before codes).
    code: Annotated[str, Field(max_length=CODE_MAX)] = ""
    source_topic: Annotated[str, Field(max_length=TOPIC_MAX)]
    source_partition: int
    source_offset: int
    key_b64: Annotated[str, Field(max_length=_b64_length(KEY_PREFIX_MAX))] | None  # None: no key
    key_length: int | None = None  # bytes of the whole key
    value_b64: Annotated[str, Field(max_length=_b64_length(VALUE_PREFIX_MAX))]  # the value's prefix
    value_length: int | None = None  # bytes of the whole value
    value_sha256: str | None = None  # hex digest of the whole value
    truncated: bool = False  # value_b64 holds only the first VALUE_PREFIX_MAX bytes
    refused_at: int  # Unix seconds

    @property
    def kind(self) -> str:
        """Its code; "unexpected" for a letter written before codes (its reason says more)."""
        return self.code or "unexpected"

    @classmethod
    def of(
        cls,
        *,
        stage: str,
        reason: str,
        code: str = "",
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
    ) -> DeadLetter:
        """The letter for a refused record: bounded, whatever the record and the reason hold."""
        value = value or b""
        return cls(
            stage=_bounded(stage, STAGE_MAX),
            reason=_bounded(reason, REASON_MAX),
            code=_bounded(code, CODE_MAX),
            source_topic=_bounded(topic, TOPIC_MAX),
            source_partition=partition,
            source_offset=offset,
            key_b64=base64.b64encode(key[:KEY_PREFIX_MAX]).decode() if key is not None else None,
            key_length=len(key) if key is not None else None,
            value_b64=base64.b64encode(value[:VALUE_PREFIX_MAX]).decode(),
            value_length=len(value),
            value_sha256=hashlib.sha256(value).hexdigest(),
            truncated=len(value) > VALUE_PREFIX_MAX,
            refused_at=int(time.time()),
        )

    def value_prefix(self) -> bytes:
        """The value's bytes the letter holds: all of it unless `truncated`."""
        return base64.b64decode(self.value_b64)

    def original_value(self) -> bytes:
        """The whole refused value; ValueError when the letter holds only a prefix of it."""
        if self.truncated:
            raise ValueError(
                f"the letter holds the first {VALUE_PREFIX_MAX} of {self.value_length} bytes: read the"
                f" original at {self.source_topic}/{self.source_partition}@{self.source_offset}"
            )
        return self.value_prefix()

    def to_json(self) -> bytes:
        return orjson.dumps(self.model_dump())


def _bounded(text: str, limit: int) -> str:
    """`text` as valid UTF-8 (a lone surrogate is written out), cut to `limit` characters with a
    marker saying how long it was."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) <= limit:
        return text
    marker = f" [... {len(text)} characters in all]"
    return text[: limit - len(marker)] + marker
