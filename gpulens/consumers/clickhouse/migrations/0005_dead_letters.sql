-- Dead letters: records nobody could process, with their bytes and the reason.

CREATE TABLE IF NOT EXISTS dead_letters
(
    event_id String COMMENT 'Id from the source coordinates.',
    failed_at DateTime64(3, 'UTC') COMMENT 'When processing failed (wall time).',
    source_topic LowCardinality(String) COMMENT 'Topic the record came from.',
    source_partition UInt32 COMMENT 'Partition it came from.',
    source_offset UInt64 COMMENT 'Offset it came from.',
    key Nullable(String) COMMENT 'Original key bytes.',
    value Nullable(String) COMMENT 'Original value bytes.',
    reason LowCardinality(String) COMMENT 'Machine-readable reason, e.g. unknown-schema-id.',
    detail String COMMENT 'Human-readable explanation.',
    consumer LowCardinality(String) COMMENT 'The consumer group or component that gave up on it.'
)
ENGINE = ReplacingMergeTree
ORDER BY (source_topic, source_partition, source_offset)
SETTINGS non_replicated_deduplication_window = 1000
COMMENT 'Records that could not be processed (gpulens.dlq.v1), one row per source record.';
