-- gpu_samples keeps what was replayed: its TTL counts from when the sink inserted a row, not from
-- when the sample was taken (counted from event time, a replay of 2022 samples was dropped as soon
-- as it was written). inserted_at is MATERIALIZED: ClickHouse fills it, the sink never writes it,
-- and SELECT * shows the same columns as before. Rows inserted before this migration count from it.

ALTER TABLE gpu_samples
    ADD COLUMN IF NOT EXISTS inserted_at DateTime('UTC') MATERIALIZED now()
    COMMENT 'When the row was inserted: sink.samples_ttl_days counts from it.';

ALTER TABLE gpu_samples MODIFY TTL $samples_ingest_ttl;
