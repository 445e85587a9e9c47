"""Ledger entries: the fast constructor and decoding build the very same entries as the class."""

from __future__ import annotations

import dataclasses

import pytest

from allmende.schemas.ledger import LedgerEntry, decode_entries, encode_entries, new_entry

FIELDS = {
    "entry_id": "e1", "job_id": "j1", "version": 7, "interval_start": 100, "interval_end": 160,
    "gpus": 8, "project": "p", "user": "u", "cluster": "c", "gpu_type": "H100",
    "priority_class": "standard", "interactive": False, "source_event_id": "s1",
    "pred_event_id": "s0", "utilization_bp": 9_000,
}  # fmt: skip


def test_the_fast_constructor_builds_an_equal_frozen_entry() -> None:
    fast, slow = new_entry(**FIELDS), LedgerEntry(**FIELDS)
    assert type(fast) is LedgerEntry and fast == slow and hash(fast) == hash(slow)
    assert dataclasses.asdict(fast) == FIELDS
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.gpus = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        new_entry(**{k: v for k, v in FIELDS.items() if k != "gpus"})  # every field, no defaults


def test_decoding_gives_the_encoded_entries_and_refuses_bad_ones() -> None:
    entries = [LedgerEntry(**FIELDS), LedgerEntry(**{**FIELDS, "entry_id": "e2", "gpus": 0})]
    assert decode_entries(encode_entries(entries)) == entries
    with pytest.raises(ValueError):
        LedgerEntry.from_dict({**FIELDS, "interval_end": 50})  # ends before it starts
    with pytest.raises(TypeError):
        LedgerEntry.from_dict({**FIELDS, "surplus": 1})
