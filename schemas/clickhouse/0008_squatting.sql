-- What the squatting pages read, so that finding a project's idle jobs costs its idle jobs and
-- not a scan of all its pieces:
--   low_pieces: the pieces under 25 % utilisation (2,500 bp; ALLMENDE_SQUAT_MAX_UTILIZATION may
--               not exceed it), keyed like job_pieces, so a reversal cancels its usage row. A
--               stretch of pieces under the threshold is exactly a stretch of these: a piece at
--               or over the cap is busy, and its absence breaks a stretch as a busy piece does.
--   job_totals: per job, its GPU-seconds and charge (sums: exact under revisions) and the latest
--               end of any of its usage rows.
-- (No backfill here: the writer's start-up check finds them behind and rebuilds them.)
CREATE TABLE IF NOT EXISTS {db}.low_pieces
(
    project        LowCardinality(String),
    job_id         String,
    piece_start    Int64,
    piece_end      Int64,
    entry_id       String,
    utilization_bp UInt16,
    user           LowCardinality(String),
    cluster        LowCardinality(String),
    gpu_seconds    Int64,
    charge_units   Int128
)
ENGINE = SummingMergeTree((gpu_seconds, charge_units))
ORDER BY (project, job_id, piece_start, piece_end, entry_id, utilization_bp, user, cluster);

CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.low_pieces_mv TO {db}.low_pieces AS
SELECT project, job_id, piece_start, piece_end, entry_id, utilization_bp, user, cluster,
       sum(gpu_seconds) AS gpu_seconds, sum(charge_units) AS charge_units
FROM {db}.ledger_postings
WHERE kind != 'revision' AND utilization_bp < 2500
GROUP BY project, job_id, piece_start, piece_end, entry_id, utilization_bp, user, cluster;

CREATE TABLE IF NOT EXISTS {db}.job_totals
(
    project      LowCardinality(String),
    job_id       String,
    gpu_seconds  SimpleAggregateFunction(sum, Int64),
    charge_units SimpleAggregateFunction(sum, Int128),
    last_end     SimpleAggregateFunction(max, Int64)
)
ENGINE = AggregatingMergeTree
ORDER BY (project, job_id);

CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.job_totals_mv TO {db}.job_totals AS
SELECT project, job_id, sum(gpu_seconds) AS gpu_seconds, sum(charge_units) AS charge_units,
       maxIf(piece_end, kind = 'usage') AS last_end
FROM {db}.ledger_postings
WHERE kind != 'revision'
GROUP BY project, job_id;
