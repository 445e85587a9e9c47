"""The fair-share record on `<prefix>.fairshare` (compacted, key: node id) and in the API.

One record per node of the tree, with every input of its factor (`sshare -l`'s columns). Usage is
decayed charged GPU-seconds (weighted by the charge policy). A level fair share with no usage
below it is infinite: JSON has no infinity, so it is the string "inf".
"""

from __future__ import annotations

from typing import Literal

import orjson
from pydantic import BaseModel, ConfigDict


class FairShareRecord(BaseModel):
    model_config = ConfigDict(frozen=True)

    as_of: int  # the stream's clock: the latest end of use the usage includes (UTC Unix seconds)
    algorithm: Literal["classic", "fair_tree"]
    node_id: str
    parent_id: str | None
    depth: int
    is_leaf: bool
    raw_shares: int | Literal["parent"]
    norm_shares: float
    raw_usage: float
    norm_usage: float
    effective_usage: float
    level_fs: float | Literal["inf"] | None
    factor: float

    def to_json(self) -> bytes:
        return orjson.dumps(self.model_dump())
