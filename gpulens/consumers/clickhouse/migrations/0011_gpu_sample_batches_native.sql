-- GPU sample batches decoded by ClickHouse itself: the sink inserts the Kafka values as they are
-- (Confluent-framed Avro) with INSERT INTO gpu_sample_batches FORMAT AvroConfluent and the setting
-- format_avro_schema_registry_url (the registry as the ClickHouse server reaches it); the view
-- below expands each batch into gpu_samples rows, the same rows the Python mapper writes.
-- gpu_sample_batches keeps nothing (Null engine). Its constraints are the event model's rules
-- (schemas/models.py: non-empty names, UTF-8 text, finite values >= 0, utilization <= 100, event
-- time in [2000, 2100)): a batch breaking one is refused whole, and the sink splits it to find
-- the record, which then goes to the DLQ through the Python decoder with its reason.

CREATE TABLE IF NOT EXISTS gpu_sample_batches
(
    event_id String,
    cluster String,
    event_time DateTime64(3, 'UTC'),
    source String,
    node String,
    samples Array(Tuple(
        device_id String,
        index Int64,
        utilization_pct Nullable(Float64),
        memory_used_bytes Nullable(Int64),
        memory_total_bytes Nullable(Int64),
        temperature_edge_c Nullable(Float64),
        temperature_junction_c Nullable(Float64),
        temperature_memory_c Nullable(Float64),
        power_watts Nullable(Float64),
        energy_joules Nullable(Float64),
        sm_clock_mhz Nullable(Float64),
        memory_clock_mhz Nullable(Float64),
        pcie_bandwidth_mbps Nullable(Float64),
        ecc_correctable Nullable(Int64),
        ecc_uncorrectable Nullable(Int64)
    )),
    CONSTRAINT names CHECK length(cluster) > 0 AND length(source) > 0 AND length(node) > 0
        AND isValidUTF8(event_id) AND isValidUTF8(cluster) AND isValidUTF8(source) AND isValidUTF8(node)
        AND arrayAll(d -> isValidUTF8(d), samples.device_id),
    CONSTRAINT event_time CHECK event_time >= toDateTime64('2000-01-01 00:00:00', 3, 'UTC')
        AND event_time < toDateTime64('2100-01-01 00:00:00', 3, 'UTC'),
    CONSTRAINT counts CHECK arrayAll(v -> v >= 0, samples.index)
        AND arrayAll(v -> ifNull(v >= 0, true), arrayConcat(samples.memory_used_bytes,
            samples.memory_total_bytes, samples.ecc_correctable, samples.ecc_uncorrectable)),
    CONSTRAINT measures CHECK arrayAll(v -> v IS NULL OR (isFinite(v) AND v >= 0), arrayConcat(
            samples.utilization_pct, samples.temperature_edge_c, samples.temperature_junction_c,
            samples.temperature_memory_c, samples.power_watts, samples.energy_joules, samples.sm_clock_mhz,
            samples.memory_clock_mhz, samples.pcie_bandwidth_mbps))
        AND arrayAll(v -> ifNull(v <= 100, true), samples.utilization_pct)
)
ENGINE = Null
COMMENT 'GpuSampleBatch records as the sink receives them (gpulens.gpu.samples.v1); kept nowhere: gpu_samples_from_batches stores them.';

CREATE MATERIALIZED VIEW IF NOT EXISTS gpu_samples_from_batches TO gpu_samples
(
    cluster LowCardinality(String),
    node LowCardinality(String),
    device_id String,
    gpu_index UInt16,
    event_time DateTime64(3, 'UTC'),
    utilization_pct Nullable(Float64),
    memory_used_bytes Nullable(Int64),
    memory_total_bytes Nullable(Int64),
    temperature_edge_c Nullable(Float64),
    temperature_junction_c Nullable(Float64),
    temperature_memory_c Nullable(Float64),
    power_watts Nullable(Float64),
    energy_joules Nullable(Float64),
    sm_clock_mhz Nullable(Float64),
    memory_clock_mhz Nullable(Float64),
    pcie_bandwidth_mbps Nullable(Float64),
    ecc_correctable Nullable(Int64),
    ecc_uncorrectable Nullable(Int64),
    event_id String,
    source LowCardinality(String)
)
AS SELECT
    cluster, node, tupleElement(s, 'device_id') AS device_id, toUInt16(tupleElement(s, 'index')) AS gpu_index, event_time,
    tupleElement(s, 'utilization_pct') AS utilization_pct, tupleElement(s, 'memory_used_bytes') AS memory_used_bytes,
    tupleElement(s, 'memory_total_bytes') AS memory_total_bytes, tupleElement(s, 'temperature_edge_c') AS temperature_edge_c,
    tupleElement(s, 'temperature_junction_c') AS temperature_junction_c, tupleElement(s, 'temperature_memory_c') AS temperature_memory_c,
    tupleElement(s, 'power_watts') AS power_watts, tupleElement(s, 'energy_joules') AS energy_joules, tupleElement(s, 'sm_clock_mhz') AS sm_clock_mhz,
    tupleElement(s, 'memory_clock_mhz') AS memory_clock_mhz, tupleElement(s, 'pcie_bandwidth_mbps') AS pcie_bandwidth_mbps,
    tupleElement(s, 'ecc_correctable') AS ecc_correctable, tupleElement(s, 'ecc_uncorrectable') AS ecc_uncorrectable, event_id, source
FROM gpu_sample_batches
ARRAY JOIN samples AS s;
