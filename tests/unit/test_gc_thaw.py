"""The API freezes the survivors of full collections (allmende/core/gc_pauses.py): a dead cycle
that was frozen is never collected by a collection, only by `thaw_and_collect`, which freezes the
survivors again."""

from __future__ import annotations

import gc
import weakref

from allmende.core.gc_pauses import thaw_and_collect


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def test_a_frozen_dead_cycle_is_freed_by_a_thaw_and_only_by_it() -> None:
    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle: reference counting never frees it
    alive = weakref.ref(a)
    gc.freeze()  # in flight at a full collection: frozen with the long-lived state
    try:
        del a, b
        gc.collect()
        assert alive() is not None  # frozen: collections do not see it
        assert thaw_and_collect() >= 2
        assert alive() is None
        assert gc.get_freeze_count() > 0  # the survivors are frozen again
    finally:
        gc.unfreeze()
