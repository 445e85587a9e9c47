-- Every admission decision ever recorded (streams/decision_writer.py, from the admission log):
-- what `GET /v1/admission/{job_id}` answers once the admission service has let go of a job.
-- One row per job and attempt; a record read twice (the writer re-reads from its saved offsets)
-- is the same row again, so reads use FINAL (or argMax). Of two records of one job and attempt,
-- the later one in the log (`log_offset`) is the one kept: the one answered last.
-- `event` is the whole AdmissionDecided as JSON (schemas/admission_events.py); the columns beside
-- it are for finding decisions. `lane` is '' for none.
CREATE TABLE IF NOT EXISTS {db}.admission_decisions
(
    job_id      String,
    attempt     UInt64,
    occurred_at Int64,
    project     LowCardinality(String),
    user        LowCardinality(String),
    cluster     LowCardinality(String),
    verdict     LowCardinality(String),
    lane        LowCardinality(String),
    event_id    String,
    log_offset  UInt64,
    event       String,
    written_at  DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree(log_offset)
ORDER BY (job_id, attempt);
