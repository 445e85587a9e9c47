"""GPUs in use per cluster, from the ledger's pieces: where the sum of runs exceeds a cluster.

One job's usage can be checked when it is metered (domain/usage_checks.py); the sum of jobs on a
cluster only where every job's usage meets: here, in `job_pieces` (every piece of every job, net
of revisions). The sweep runs in ClickHouse: each piece adds its GPUs at its start and takes them
back at its end, a running sum per cluster gives the GPUs in use after each change, and only the
changes above the cluster's capacity come back. It reads every piece ending after `since`:
`job_pieces` is ordered by project, so the filter cannot use its index and a round of the alerter
scans the table (a projection ordered by cluster and time would bound that on a large ledger).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from allmende.core.clickhouse import Database
from allmende.domain.capacity import Episode, Found, InUse, RunOnCluster, accounted_for, episodes

MAX_EPISODES = 20  # per round: each costs a query of its runs

# A piece's GPUs: its GPU-seconds (net of revisions) over its length; pieces with nothing left
# (reversed) drop out.
_PIECES = (
    "SELECT toString(cluster) AS cluster, job_id, any(project) AS job_project, piece_start, piece_end,"
    " intDiv(sum(gpu_seconds), piece_end - piece_start) AS gpus"
    " FROM {db}.job_pieces WHERE piece_end > {since:Int64} AND piece_end > piece_start AND {where}"
    " GROUP BY cluster, job_id, piece_start, piece_end HAVING sum(gpu_seconds) > 0"
)


class CapacityQueries:
    def __init__(self, db: Database) -> None:
        self.db = db

    def over_capacity(self, capacity: Mapping[str, int], since: int) -> list[InUse]:
        """Each stretch after `since` in which a declared cluster ran more GPUs than it has,
        sorted by cluster and start."""
        if not capacity:
            return []
        names, gpus = list(capacity), [capacity[n] for n in capacity]
        pieces = _PIECES.replace("{where}", "cluster IN {names:Array(String)}")
        rows = self.db.rows(
            "SELECT cluster, t, next_t, in_use FROM ("
            "  SELECT cluster, t,"
            "   sum(d) OVER (PARTITION BY cluster ORDER BY t"
            "     ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS in_use,"
            "   leadInFrame(t) OVER (PARTITION BY cluster ORDER BY t"
            "     ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) AS next_t"
            "  FROM (SELECT cluster, change.1 AS t, sum(change.2) AS d FROM ("
            "    SELECT cluster, arrayJoin([(piece_start, gpus), (piece_end, -gpus)]) AS change"
            f"    FROM ({pieces})) GROUP BY cluster, t))"
            " WHERE in_use > transform(cluster, {names:Array(String)}, {gpus:Array(Int64)}, toInt64(0))"
            "  AND next_t > t AND next_t > {since:Int64}"
            " ORDER BY cluster, t",
            {"names": names, "gpus": gpus, "since": since},
        )  # fmt: skip
        return [InUse(str(c), int(t), int(n), int(g)) for c, t, n, g in rows]

    def runs_in(self, episode: Episode) -> list[RunOnCluster]:
        """The runs on the episode's cluster during it: the most GPUs each used in it, and when it
        first appears in the ledger (its first piece, however long ago)."""
        during = _PIECES.replace("{where}", "cluster = {c:String} AND piece_start < {end:Int64}")
        rows = self.db.rows(
            f"SELECT job_id, any(job_project), max(gpus) FROM ({during}) GROUP BY job_id ORDER BY job_id",
            {"c": episode.cluster, "since": episode.start, "end": episode.end},
        )
        if not rows:
            return []
        keys = [(str(p), str(j)) for j, p, _ in rows]
        first = dict(
            self.db.rows(
                "SELECT job_id, min(piece_start) FROM ("
                + _PIECES.replace("{where}", "(project, job_id) IN {keys:Array(Tuple(String, String))}")
                + ") GROUP BY job_id",
                {"keys": keys, "since": 0},
            )
        )
        return [RunOnCluster(str(j), str(p), int(first.get(j, episode.start)), int(g)) for j, p, g in rows]

    def found(self, capacity: Mapping[str, int], since: int, limit: int = MAX_EPISODES) -> list[Found]:
        """The newest `limit` episodes after `since`, each with the runs on its cluster then."""
        found = episodes(self.over_capacity(capacity, since), capacity)
        newest = sorted((replace(e, clipped=e.start <= since) for e in found), key=lambda e: -e.start)
        with_runs = [(episode, self.runs_in(episode)) for episode in newest[:limit]]
        # Two reads: the writer may post between them (a run withheld as disputed meanwhile). An
        # episode whose runs no longer add up to its peak is left to the next round, settled.
        return [(e, runs) for e, runs in with_runs if accounted_for(e, runs)]
