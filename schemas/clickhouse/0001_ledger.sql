-- The GPU-hour ledger: append-only postings (see domain/postings.py).
-- No PARTITION BY on purpose: one writer batch is one INSERT, one part, so it lands whole or
-- not at all; the writer's version check then makes a retried batch post nothing twice.
CREATE TABLE IF NOT EXISTS {db}.ledger_postings
(
    posting_id      String,
    kind            Enum8('revision' = 0, 'usage' = 1, 'reversal' = 2),
    entry_id        String,
    job_id          String,
    version         UInt64,
    interval_start  Int64,
    interval_end    Int64,
    gpus            UInt32,
    day             Date,
    piece_start     Int64,
    piece_end       Int64,
    gpu_seconds     Int64,
    project         LowCardinality(String),
    user            LowCardinality(String),
    cluster         LowCardinality(String),
    gpu_type        LowCardinality(String),
    priority_class  LowCardinality(String),
    interactive     Bool,
    source_event_id String,
    pred_event_id   String,
    written_at      DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = MergeTree
ORDER BY (job_id, entry_id, version, posting_id);

-- What the writer has consumed, per topic partition: the next offset to read. Written after
-- each batch; replaying from an older offset is harmless because posting is idempotent.
CREATE TABLE IF NOT EXISTS {db}.ingest_offsets
(
    consumer    LowCardinality(String),
    topic       LowCardinality(String),
    partition   UInt32,
    next_offset UInt64,
    updated_at  DateTime64(6, 'UTC') DEFAULT now64(6)
)
ENGINE = ReplacingMergeTree(updated_at)
ORDER BY (consumer, topic, partition);
