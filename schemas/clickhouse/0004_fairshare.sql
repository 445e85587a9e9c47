-- Fair-share snapshots as the calculator publishes them: every node's inputs and factor at the
-- stream's clock (`as_of`). Replacing on (algorithm, as_of, node): a snapshot published twice
-- (a restart, a replay) is one snapshot.
CREATE TABLE IF NOT EXISTS {db}.fairshare_history
(
    as_of           Int64,
    algorithm       LowCardinality(String),
    node_id         String,
    parent_id       String,
    depth           UInt16,
    is_leaf         Bool,
    raw_shares      String,
    norm_shares     Float64,
    raw_usage       Float64,
    norm_usage      Float64,
    effective_usage Float64,
    level_fs        Nullable(Float64),
    factor          Float64,
    published_at    DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree(published_at)
ORDER BY (algorithm, as_of, node_id);
