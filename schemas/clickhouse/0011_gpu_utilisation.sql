-- GPU utilisation the GPUs themselves measured (dcgm-exporter samples through the meter, issue 24;
-- domain/gpu_utilisation.py): one row per job, node and scrape period whose GPUs' mean
-- utilisation was under 2,500 bp (the squatting cap, as low_pieces). A missing row reads as busy.
-- Rows never charge: the ledger's postings do. Keyed by (project, job, node, end): a sample
-- metered twice is one row once merged (read with FINAL). A job's samples that came before its
-- JobSubmitted come attributed once it does; nothing is written for them before.
CREATE TABLE IF NOT EXISTS {db}.gpu_utilisation
(
    project        LowCardinality(String),
    job_id         String,
    node           String,
    piece_end      Int64,
    piece_start    Int64,
    gpus           UInt16,
    utilization_bp UInt16,
    user           LowCardinality(String),
    cluster        LowCardinality(String)
)
ENGINE = ReplacingMergeTree
ORDER BY (project, job_id, node, piece_end);

-- GPUs busy with no job on them (unaccounted use: nobody can be charged), per node and scrape
-- period, from the samples of a node's unmapped GPUs: the overview's "unaccounted" line.
CREATE TABLE IF NOT EXISTS {db}.gpu_unaccounted
(
    node           String,
    piece_start    Int64,
    piece_end      Int64,
    gpus           UInt16,
    utilization_bp UInt16
)
ENGINE = ReplacingMergeTree
ORDER BY (node, piece_end);
