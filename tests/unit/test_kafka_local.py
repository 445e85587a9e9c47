"""The local broker's cluster ids: valid for KRaft and never mistaken for an option."""

from __future__ import annotations

import base64

from allmende.core.kafka_local import new_cluster_id


def test_cluster_ids_are_16_bytes_of_base64url_and_never_start_with_a_dash() -> None:
    # One random id in 64 starts with '-' if nothing prevents it; 5,000 draws miss that ~never.
    ids = [new_cluster_id() for _ in range(5_000)]
    assert not [i for i in ids if i.startswith("-")]
    assert all(len(base64.urlsafe_b64decode(i + "==")) == 16 for i in ids)
    assert len(set(ids)) == len(ids)
