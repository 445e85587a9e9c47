"""Admission tickets: a decision, signed, for a scheduler plugin to check without asking anyone.

The admission API signs what it decided for one job (`issue`); Slurm's job_submit.lua checks the
ticket a job carries against exactly what the job asks for, with the same key, inside slurmctld and
without a network round trip (integrations/slurm/job_submit.lua does there what `verify` does here).

Format `v1.<payload hex>.<HMAC-SHA256 hex>`: the payload is compact JSON, hex-encoded because Lua
5.1 has neither base64 nor a URL-safe alphabet, and hex survives a Slurm comment untouched; the
MAC covers the hex text itself, so the checker needs no decoding before it compares. The payload
names the admission id, what was decided for (project, user, cluster, GPU type and count, priority
class, interactive, requested seconds), the verdict and lane, when it was issued and until when it
may be used (`exp`), and whether it came from a dry run (never valid for a real submission).

A ticket is a bearer credential for one job: the checker must also refuse a second job presenting
the same admission id (job_submit.lua keeps the ids it has seen until their tickets expire).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

VERSION = "v1"
FIELDS = ("project", "user", "cluster", "gpu_type", "gpus", "priority_class", "interactive",
          "requested_seconds")  # fmt: skip  # what a job must ask for exactly


@dataclass(frozen=True)
class Ticket:
    job_id: str
    request: dict[str, Any]  # FIELDS -> value
    verdict: str
    lane: str | None
    issued_at: int
    expires_at: int
    dry_run: bool


class TicketInvalid(ValueError):
    """The ticket cannot be trusted: why, in a sentence."""


def _mac(key: bytes, text: str) -> str:
    return hmac.new(key, text.encode("ascii"), hashlib.sha256).hexdigest()


def issue(ticket: Ticket, key: bytes) -> str:
    payload = {
        "v": 1, "id": ticket.job_id, **{f: ticket.request[f] for f in FIELDS},
        "verdict": ticket.verdict, "lane": ticket.lane, "iat": ticket.issued_at,
        "exp": ticket.expires_at, "dry": ticket.dry_run,
    }  # fmt: skip
    hexed = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode().hex()
    return f"{VERSION}.{hexed}.{_mac(key, hexed)}"


def verify(text: str, key: bytes, now: int) -> Ticket:
    """The ticket's content if its MAC is right and it has not expired; else TicketInvalid."""
    version, _, rest = text.partition(".")
    hexed, _, mac = rest.partition(".")
    if version != VERSION or not hexed or not mac:
        raise TicketInvalid("not an admission ticket")
    if not hmac.compare_digest(_mac(key, hexed), mac):
        raise TicketInvalid("its signature is wrong (forged, altered, or signed with another key)")
    try:
        payload = json.loads(bytes.fromhex(hexed))
    except ValueError as exc:
        raise TicketInvalid(f"its payload cannot be read ({exc})") from None
    if payload["exp"] < now:
        raise TicketInvalid(f"it expired at {payload['exp']}")
    return Ticket(
        job_id=payload["id"], request={f: payload[f] for f in FIELDS}, verdict=payload["verdict"],
        lane=payload["lane"], issued_at=payload["iat"], expires_at=payload["exp"], dry_run=payload["dry"],
    )  # fmt: skip
