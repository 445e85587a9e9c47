-- The ledger's horizon, kept by a view so that reading it costs the parts of a one-row table, not
-- a scan of the postings (which grows with the ledger):
--   charged_to: the latest instant of charged usage (what policies may not start before, and the
--               dashboards' "now" for a replayed trace);
--   closed_to:  the latest end of any entry version posted. A balance as of an instant at or after
--               it counts every entry (all have closed by then), so it may read the daily
--               projection instead of clipping pieces.
-- A max is idempotent: the backfill below may overlap inserts the view already saw.
CREATE TABLE IF NOT EXISTS {db}.ledger_horizon
(
    charged_to SimpleAggregateFunction(max, Int64),
    closed_to  SimpleAggregateFunction(max, Int64)
)
ENGINE = AggregatingMergeTree
ORDER BY tuple();

CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.ledger_horizon_mv TO {db}.ledger_horizon AS
SELECT maxIf(piece_end, kind = 'usage') AS charged_to,
       maxIf(interval_end, kind != 'revision') AS closed_to
FROM {db}.ledger_postings;

INSERT INTO {db}.ledger_horizon
SELECT maxIf(piece_end, kind = 'usage'), maxIf(interval_end, kind != 'revision')
FROM {db}.ledger_postings;
