-- Idle GPU-hours by owner, split by kind (the worker's `idle` processor). One row per window, GPU
-- and owner; the unallocated remainder of a GPU has workload_uid ''. Per GPU and window the five
-- kinds add up to the GPU's total (1, a MIG instance its share) times the time it was known.

CREATE TABLE IF NOT EXISTS idle_gpu_hours
(
    event_id String COMMENT 'cluster, node, device, workload and window start.',
    cluster LowCardinality(String) COMMENT 'Cluster name.',
    window_start DateTime64(3, 'UTC') COMMENT 'Window start (inclusive).',
    window_end DateTime64(3, 'UTC') COMMENT 'Window end (exclusive).',
    node String COMMENT 'Node name.',
    device_id String COMMENT 'GpuDevice.device_id; empty: GPUs held with no device known.',
    workload_uid String COMMENT 'Top owner uid (the pod uid for a bare pod); empty: unallocated.',
    workload_kind LowCardinality(String) COMMENT 'Deployment, PyTorchJob, ... or Pod.',
    workload_name String COMMENT 'Top owner name.',
    namespace LowCardinality(String) COMMENT 'Namespace.',
    owner_labels Map(String, String) COMMENT 'The pod labels named in [pipeline] owner_labels.',
    active_gpu_hours Float64 COMMENT 'Held, utilization at or above the idle threshold.',
    idle_gpu_hours Float64 COMMENT 'Held, utilization under the idle threshold.',
    memory_idle_gpu_hours Float64 COMMENT 'Held, utilization near 0 with VRAM used above the floor.',
    unmeasured_gpu_hours Float64 COMMENT 'Held with no valid sample of the GPU.',
    unallocated_gpu_hours Float64 COMMENT 'The GPU hours nobody held.'
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(window_start)
ORDER BY (cluster, window_start, node, device_id, workload_uid)
SETTINGS non_replicated_deduplication_window = 1000
COMMENT 'Idle GPU-hours by owner: per window, GPU and owner (gpulens.agg.idle-gpu-hours.v1).';
