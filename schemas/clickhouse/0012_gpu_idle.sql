-- GPU samples under the squatting cap, as the sample writer writes them straight from the
-- collector's topic (streams/sample_writer.py, issue 24): keyed by (job, node, end), so a sample
-- written twice is one row once merged (read with FINAL). Rows carry the job alone: whose it is
-- comes from job_attribution when they are read, so a sample never waits for its JobSubmitted.
CREATE TABLE IF NOT EXISTS {db}.gpu_idle
(
    job_id         String,
    node           String,
    piece_end      Int64,
    piece_start    Int64,
    gpus           UInt16,
    utilization_bp UInt16
)
ENGINE = ReplacingMergeTree
ORDER BY (job_id, node, piece_end);

-- Whose a job is (project, user, cluster), from its JobSubmitted: one row per job, emitted by the
-- meter on the ledger-entry topic. Read by project (the key) and by job (the bloom filter).
CREATE TABLE IF NOT EXISTS {db}.job_attribution
(
    project LowCardinality(String),
    job_id  String,
    user    LowCardinality(String),
    cluster LowCardinality(String),
    INDEX job_ids job_id TYPE bloom_filter GRANULARITY 1
)
ENGINE = ReplacingMergeTree
ORDER BY (project, job_id);

-- What 0011's table holds moves over (it is written no more; left in place, so a start that
-- stops half-way through this migration can run it again).
INSERT INTO {db}.gpu_idle SELECT job_id, node, piece_end, piece_start, gpus, utilization_bp FROM {db}.gpu_utilisation;
INSERT INTO {db}.job_attribution (project, job_id, user, cluster)
SELECT DISTINCT project, job_id, user, cluster FROM {db}.gpu_utilisation
