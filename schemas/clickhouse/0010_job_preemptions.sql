-- Every preemption a job suffered (streams/preemption_writer.py, from the job-event topic): what
-- a project's preemptions page lists once the admission service has let go of the job. One row
-- per JobPreempted event; a record read twice is the same row (read with FINAL).
CREATE TABLE IF NOT EXISTS {db}.job_preemptions
(
    job_id     String,
    event_id   String,
    at         Int64,
    reason     String,
    written_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree
ORDER BY (job_id, event_id);
