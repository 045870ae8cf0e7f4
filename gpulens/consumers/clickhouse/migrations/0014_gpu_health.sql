-- GPU health as the node agents publish it (gpulens.gpu.health.v1): one row per change of a GPU's
-- health (an XID, error counters that moved, a condition that cleared), its full state each time.
-- "Which GPUs are failing?" is the newest row per GPU with healthy = false.

CREATE TABLE IF NOT EXISTS gpu_health
(
    event_id String COMMENT 'Deterministic id of the observation.',
    cluster LowCardinality(String) COMMENT 'Cluster name.',
    event_time DateTime64(3, 'UTC') COMMENT 'When the agent saw it (event time).',
    source LowCardinality(String) COMMENT 'What observed it (node-agent).',
    node LowCardinality(String) COMMENT 'Node name.',
    device_id String COMMENT 'GPU device_id (as in gpu_devices).',
    gpu_index UInt16 COMMENT 'GPU index on the node.',
    vendor LowCardinality(String) COMMENT 'AMD or NVIDIA.',
    healthy Bool COMMENT 'No critical condition holds on the GPU.',
    conditions Array(String) COMMENT 'Critical conditions holding: xid-79, ecc-uncorrectable, ras-uncorrectable.umc, ...',
    cause LowCardinality(String) COMMENT 'What the row reports: xid, counters or cleared.',
    xid Nullable(Int64) COMMENT 'The XID that arrived (cause xid).',
    counters Map(String, Int64) COMMENT 'Error counters as the library names them (NVML, amdsmi).',
    message String COMMENT 'What happened, for people.'
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(event_time)
ORDER BY (cluster, node, device_id, event_time, event_id)
SETTINGS non_replicated_deduplication_window = 1000
COMMENT 'GPU health events: XIDs, ECC and RAS counters, retired or remapped memory (gpulens.gpu.health.v1).';
