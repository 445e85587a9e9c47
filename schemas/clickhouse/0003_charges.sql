-- Charges beside GPU-seconds: every usage and reversal posting carries the rate of the policy in
-- force for its piece (charge units per GPU-second, see domain/charging.py) and the signed charge.
-- Int128: a charge is GPU-seconds x three fixed-point factors and must never wrap.
ALTER TABLE {db}.ledger_postings ADD COLUMN IF NOT EXISTS rate UInt64 DEFAULT 0 AFTER gpu_seconds;
ALTER TABLE {db}.ledger_postings ADD COLUMN IF NOT EXISTS charge_units Int128 DEFAULT 0 AFTER rate;
ALTER TABLE {db}.ledger_postings ADD COLUMN IF NOT EXISTS policy_id LowCardinality(String) DEFAULT '' AFTER charge_units;

-- The daily projection gains the charge. A SummingMergeTree's summed columns are fixed at
-- creation, so it is created anew; the writer's start-up check finds it empty and rebuilds it
-- from the postings.
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
    postings       Int64
)
ENGINE = SummingMergeTree((gpu_seconds, charge_units, postings))
ORDER BY (project, day, user, cluster, gpu_type, priority_class, interactive);

CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.usage_daily_mv TO {db}.usage_daily AS
SELECT project, day, user, cluster, gpu_type, priority_class, interactive,
       sum(gpu_seconds) AS gpu_seconds, sum(charge_units) AS charge_units, count() AS postings
FROM {db}.ledger_postings
WHERE kind != 'revision'
GROUP BY project, day, user, cluster, gpu_type, priority_class, interactive;
