-- Idle GPUs: every usage and reversal posting carries its entry's GPU utilisation in basis points
-- (10,000 = fully busy) and its idle units = gpu_seconds x (10,000 - utilization_bp), signed like
-- gpu_seconds: 10,000 idle units are one fully idle GPU-second, exact for any piece.
ALTER TABLE {db}.ledger_postings ADD COLUMN IF NOT EXISTS utilization_bp UInt16 DEFAULT 10000;
ALTER TABLE {db}.ledger_postings ADD COLUMN IF NOT EXISTS idle_units Int64 DEFAULT 0;

-- The daily projection gains the idle units (summed columns are fixed at creation: made anew;
-- the writer's start-up check finds it behind and rebuilds it from the postings).
DROP TABLE IF EXISTS {db}.usage_daily_mv;
DROP TABLE IF EXISTS {db}.usage_daily;

CREATE TABLE IF NOT EXISTS {db}.usage_daily
(
    project        LowCardinality(String),
    day            Date,
    user           LowCardinality(String),
    cluster        LowCardinality(String),
    gpu_type       LowCardinality(String),
    priority_class LowCardinality(String),
    interactive    Bool,
    gpu_seconds    Int64,
    charge_units   Int128,
    idle_units     Int64,
    postings       Int64
)
ENGINE = SummingMergeTree((gpu_seconds, charge_units, idle_units, postings))
ORDER BY (project, day, user, cluster, gpu_type, priority_class, interactive);

CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.usage_daily_mv TO {db}.usage_daily AS
SELECT project, day, user, cluster, gpu_type, priority_class, interactive,
       sum(gpu_seconds) AS gpu_seconds, sum(charge_units) AS charge_units,
       sum(idle_units) AS idle_units, count() AS postings
FROM {db}.ledger_postings
WHERE kind != 'revision'
GROUP BY project, day, user, cluster, gpu_type, priority_class, interactive;

-- The pieces of every job, ordered by project: what the dashboards read per project (squatting,
-- time-slice use) without scanning the whole ledger, which is ordered by job. A reversal has the
-- key of the usage row it reverses, so the two cancel (and vanish on merge); read with
-- sum() ... GROUP BY ... HAVING sum(gpu_seconds) != 0.
CREATE TABLE IF NOT EXISTS {db}.job_pieces
(
    project        LowCardinality(String),
    job_id         String,
    piece_start    Int64,
    piece_end      Int64,
    entry_id       String,
    interval_end   Int64,
    utilization_bp UInt16,
    user           LowCardinality(String),
    cluster        LowCardinality(String),
    gpu_type       LowCardinality(String),
    priority_class LowCardinality(String),
    interactive    Bool,
    gpu_seconds    Int64,
    charge_units   Int128,
    idle_units     Int64,
    postings       Int64
)
ENGINE = SummingMergeTree((gpu_seconds, charge_units, idle_units, postings))
ORDER BY (project, job_id, piece_start, piece_end, entry_id, interval_end, utilization_bp,
          user, cluster, gpu_type, priority_class, interactive);

CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.job_pieces_mv TO {db}.job_pieces AS
SELECT project, job_id, piece_start, piece_end, entry_id, interval_end, utilization_bp,
       user, cluster, gpu_type, priority_class, interactive,
       sum(gpu_seconds) AS gpu_seconds, sum(charge_units) AS charge_units,
       sum(idle_units) AS idle_units, count() AS postings
FROM {db}.ledger_postings
WHERE kind != 'revision'
GROUP BY project, job_id, piece_start, piece_end, entry_id, interval_end, utilization_bp,
         user, cluster, gpu_type, priority_class, interactive;
