"""Allocation requests: a project's lead asks for more GPU-hours, a later end, or a time-slice
window; an admin approves (possibly another amount) or denies. The fold keeps each request with its
decision; the rules of what may be asked and decided are `AdminState.check`'s."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

from allmende.schemas.admin_events import AllocationRequestDecided, AllocationRequested

Status = Literal["open", "approved", "denied"]


@dataclass(frozen=True, slots=True)
class AllocationRequest:
    asked: AllocationRequested
    decided: AllocationRequestDecided | None = None

    @property
    def request_id(self) -> str:
        return self.asked.request_id

    @property
    def project(self) -> str:
        return self.asked.project

    @property
    def status(self) -> Status:
        return "open" if self.decided is None else self.decided.decision


def request_id_of(key: str | None, random_hex: str) -> str:
    """`req-<16 hex>`: from the idempotency key (a retry asks once), else random."""
    if key is None:
        return f"req-{random_hex[:16]}"
    return f"req-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
