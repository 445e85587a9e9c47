-- GPU-seconds per project, cluster and UTC hour: what the time-slice pages read, so that the use
-- of a window costs its hours, not a scan of the project's pieces. Each posting is cut at the
-- hours it spans; a posting's GPU-seconds are GPUs x seconds, so every part is an exact integer.
-- (No backfill here: the writer's start-up check finds the new projection behind the postings
-- and rebuilds every projection from them.)
CREATE TABLE IF NOT EXISTS {db}.usage_hourly
(
    project     LowCardinality(String),
    cluster     LowCardinality(String),
    hour        Int64,
    gpu_seconds Int64
)
ENGINE = SummingMergeTree(gpu_seconds)
ORDER BY (project, cluster, hour);

CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.usage_hourly_mv TO {db}.usage_hourly AS
SELECT project, cluster, hour,
       sum(intDiv(gpu_seconds * (least(piece_end, (hour + 1) * 3600) - greatest(piece_start, hour * 3600)),
                  piece_end - piece_start)) AS gpu_seconds
FROM {db}.ledger_postings
ARRAY JOIN range(intDiv(piece_start, 3600), intDiv(piece_end - 1, 3600) + 1) AS hour
WHERE kind != 'revision' AND piece_end > piece_start
GROUP BY project, cluster, hour;
