"""The dead-letter record on `allmende.dead-letter`: why a message was refused, with its bytes."""

from __future__ import annotations

import base64
import time

import orjson
from pydantic import BaseModel


class DeadLetter(BaseModel):
    stage: str  # which component refused it: "meter", "ledger-writer", ...
    reason: str
    source_topic: str
    source_partition: int
    source_offset: int
    key_b64: str | None
    value_b64: str
    refused_at: int  # Unix seconds

    @classmethod
    def of(
        cls,
        *,
        stage: str,
        reason: str,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
    ) -> DeadLetter:
        return cls(
            stage=stage,
            reason=reason,
            source_topic=topic,
            source_partition=partition,
            source_offset=offset,
            key_b64=base64.b64encode(key).decode() if key is not None else None,
            value_b64=base64.b64encode(value or b"").decode(),
            refused_at=int(time.time()),
        )

    def original_value(self) -> bytes:
        return base64.b64decode(self.value_b64)

    def to_json(self) -> bytes:
        return orjson.dumps(self.model_dump())
