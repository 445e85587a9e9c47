-- Usage by project, user, cluster, GPU type, priority class and UTC day, kept by a
-- materialized view over the postings. SummingMergeTree folds rows on merge only: read with
-- sum() ... GROUP BY. The writer checks it against the postings at start and rebuilds it if a
-- crash left the two apart (a view sees only inserts, so a lost push is not replayed).
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
    postings       Int64
)
ENGINE = SummingMergeTree((gpu_seconds, postings))
ORDER BY (project, day, user, cluster, gpu_type, priority_class, interactive);

CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.usage_daily_mv TO {db}.usage_daily AS
SELECT project, day, user, cluster, gpu_type, priority_class, interactive,
       sum(gpu_seconds) AS gpu_seconds, count() AS postings
FROM {db}.ledger_postings
WHERE kind != 'revision'
GROUP BY project, day, user, cluster, gpu_type, priority_class, interactive;
