-- GPU time series: one row per GPU per collection, flattened from GpuSampleBatch.
-- $samples_ttl keeps sink.samples_ttl_days days; migrate re-applies it when the setting changes.

CREATE TABLE IF NOT EXISTS gpu_samples
(
    cluster LowCardinality(String) COMMENT 'Cluster name.',
    node LowCardinality(String) COMMENT 'Node name.',
    device_id String COMMENT 'gpu_devices.device_id.',
    gpu_index UInt16 COMMENT 'GPU index on the node.',
    event_time DateTime64(3, 'UTC') COMMENT 'When the sample was taken.',
    utilization_pct Nullable(Float64) COMMENT 'GFX/SM activity, percent.',
    memory_used_bytes Nullable(Int64) COMMENT 'VRAM used, bytes.',
    memory_total_bytes Nullable(Int64) COMMENT 'VRAM total, bytes.',
    temperature_edge_c Nullable(Float64) COMMENT 'Edge/GPU temperature, C.',
    temperature_junction_c Nullable(Float64) COMMENT 'Junction/hotspot temperature, C.',
    temperature_memory_c Nullable(Float64) COMMENT 'Memory temperature, C.',
    power_watts Nullable(Float64) COMMENT 'Socket/board power, W.',
    energy_joules Nullable(Float64) COMMENT 'Energy counter, J.',
    sm_clock_mhz Nullable(Float64) COMMENT 'Graphics/SM clock, MHz.',
    memory_clock_mhz Nullable(Float64) COMMENT 'Memory clock, MHz.',
    pcie_bandwidth_mbps Nullable(Float64) COMMENT 'PCIe bandwidth, MB/s.',
    ecc_correctable Nullable(Int64) COMMENT 'Correctable ECC errors (total).',
    ecc_uncorrectable Nullable(Int64) COMMENT 'Uncorrectable ECC errors (total).',
    event_id String COMMENT 'Id of the GpuSampleBatch: (event_id, device_id) is a sample.',
    source LowCardinality(String) COMMENT 'What observed it.'
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(event_time)
ORDER BY (cluster, node, device_id, event_time, event_id)
TTL $samples_ttl
SETTINGS ttl_only_drop_parts = 1, non_replicated_deduplication_window = 1000
COMMENT 'GPU metrics, one row per GPU per collection (gpulens.gpu.samples.v1); kept sink.samples_ttl_days.';
