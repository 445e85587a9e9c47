"""Admission tickets: what the API signs is what the checker reads back, and nothing else passes."""

from __future__ import annotations

import pytest

from allmende.domain.admission_tickets import FIELDS, Ticket, TicketInvalid, issue, verify

KEY = b"a key of the API's"
REQUEST = {
    "project": "rich", "user": "alice", "cluster": "h100-a", "gpu_type": "H100", "gpus": 8,
    "priority_class": "non-preemptible", "interactive": True, "requested_seconds": 7200,
}  # fmt: skip


def _ticket(**changes: object) -> Ticket:
    fields: dict[str, object] = {
        "job_id": "slurm-h100-a-1-ab", "request": REQUEST, "verdict": "admit", "lane": "budget",
        "issued_at": 1_000, "expires_at": 1_300, "dry_run": False, **changes,
    }  # fmt: skip
    return Ticket(**fields)  # type: ignore[arg-type]


def test_a_ticket_reads_back_exactly_what_was_signed() -> None:
    ticket = _ticket()
    assert verify(issue(ticket, KEY), KEY, now=1_300) == ticket
    assert set(FIELDS) == set(REQUEST)


@pytest.mark.parametrize(
    ("text", "key", "now", "why"),
    [
        (issue(_ticket(), KEY), b"another key", 1_000, "signature is wrong"),
        (issue(_ticket(), KEY), KEY, 1_301, "expired"),
        (issue(_ticket(), KEY).replace("2267707573223a38", "2267707573223a39"), KEY, 1_000, "signature"),
        ("v2." + issue(_ticket(), KEY)[3:], KEY, 1_000, "not an admission ticket"),
        ("anything", KEY, 1_000, "not an admission ticket"),
    ],
)
def test_a_ticket_not_signed_with_the_key_or_expired_or_altered_is_refused(
    text: str, key: bytes, now: int, why: str
) -> None:
    with pytest.raises(TicketInvalid, match=why):
        verify(text, key, now)


def test_an_altered_gpu_count_is_what_the_signature_catches() -> None:
    text = issue(_ticket(), KEY)
    assert "2267707573223a38" in text  # `"gpus":8`, hex: the alteration the case above makes
