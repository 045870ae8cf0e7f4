-- Derived streams of the worker: workload usage, cluster overview, alerts, device changelog.
-- Keys make a re-delivered row collapse into one (read with FINAL).

CREATE TABLE IF NOT EXISTS workload_gpu_usage
(
    event_id String COMMENT 'cluster, workload and window start.',
    cluster LowCardinality(String) COMMENT 'Cluster name.',
    workload_uid String COMMENT 'Top owner uid (the pod uid for a bare pod).',
    workload_kind LowCardinality(String) COMMENT 'Deployment, PyTorchJob, ... or Pod.',
    workload_name String COMMENT 'Top owner name.',
    namespace LowCardinality(String) COMMENT 'Namespace.',
    window_start DateTime64(3, 'UTC') COMMENT 'Window start (inclusive).',
    window_end DateTime64(3, 'UTC') COMMENT 'Window end (exclusive).',
    gpus_allocated_avg Float64 COMMENT 'Time-weighted mean of GPUs its pods held.',
    gpus_allocated_max Float64 COMMENT 'Most GPUs its pods held at any instant.',
    gpus_allocated_end Float64 COMMENT 'GPUs its pods held at window end.',
    utilization_avg Nullable(Float64) COMMENT 'Mean utilization of its GPU samples, %.',
    utilization_max Nullable(Float64) COMMENT 'Highest sample utilization, %.',
    samples UInt32 COMMENT 'GPU samples of its GPUs in the window.',
    pods_active_end UInt32 COMMENT 'Its pods holding GPUs at window end.'
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(window_start)
ORDER BY (cluster, workload_uid, window_start)
SETTINGS non_replicated_deduplication_window = 1000
COMMENT 'GPU consumers: per workload and window (gpulens.agg.workload-gpu-usage.v1).';

CREATE TABLE IF NOT EXISTS cluster_overview
(
    event_id String COMMENT 'cluster and window start.',
    cluster LowCardinality(String) COMMENT 'Cluster name.',
    window_start DateTime64(3, 'UTC') COMMENT 'Window start (inclusive).',
    window_end DateTime64(3, 'UTC') COMMENT 'Window end (exclusive).',
    nodes_total UInt32 COMMENT 'Nodes known (not deleted).',
    nodes_healthy UInt32 COMMENT 'Ready and schedulable.',
    nodes_not_ready UInt32 COMMENT 'Ready condition not True.',
    nodes_cordoned UInt32 COMMENT 'Ready but unschedulable.',
    nodes_fully_idle UInt32 COMMENT 'Healthy GPU nodes with no GPU held.',
    nodes_partially_idle UInt32 COMMENT 'Healthy GPU nodes with some but not all GPUs held.',
    nodes_busy UInt32 COMMENT 'Healthy GPU nodes with every GPU held.',
    gpu_capacity Float64 COMMENT 'As in cluster_gpu_allocation.',
    gpus_allocated_avg Float64 COMMENT 'As in cluster_gpu_allocation.',
    allocation_rate_avg Nullable(Float64) COMMENT 'As in cluster_gpu_allocation.',
    gpu_utilization_avg Nullable(Float64) COMMENT 'Mean of every GPU sample, %.',
    gpu_samples UInt32 COMMENT 'GPU samples in the window.'
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(window_start)
ORDER BY (cluster, window_start)
SETTINGS non_replicated_deduplication_window = 1000
COMMENT 'Node health, idleness, allocation and utilization per cluster and window.';

CREATE TABLE IF NOT EXISTS alerts
(
    event_id String COMMENT 'Deterministic id of this opening or resolution.',
    cluster LowCardinality(String) COMMENT 'Cluster name.',
    event_time DateTime64(3, 'UTC') COMMENT 'When it opened or resolved (event time).',
    source LowCardinality(String) COMMENT 'What raised it.',
    alert LowCardinality(String) COMMENT 'GpuIdle, GpuPodPending, NodeNotReady or GpuLost.',
    state LowCardinality(String) COMMENT 'OPENED or RESOLVED.',
    entity String COMMENT 'GPU id, pod uid or node name.',
    node Nullable(String) COMMENT 'Node concerned.',
    gpu_id Nullable(String) COMMENT 'GPU concerned.',
    pod_uid Nullable(String) COMMENT 'Pod concerned.',
    pod_namespace Nullable(String) COMMENT 'Its namespace.',
    pod_name Nullable(String) COMMENT 'Its name.',
    since DateTime64(3, 'UTC') COMMENT 'When the condition began.',
    message String COMMENT 'What happened, for people.',
    labels Map(String, String) COMMENT 'Details: reason, free GPUs by model, ...'
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(event_time)
ORDER BY (cluster, alert, entity, event_time, event_id)
SETTINGS non_replicated_deduplication_window = 1000
COMMENT 'Alerts opened and resolved (gpulens.alerts.v1).';

CREATE TABLE IF NOT EXISTS device_changelog
(
    event_id String COMMENT 'Deterministic id of the change.',
    cluster LowCardinality(String) COMMENT 'Cluster name.',
    event_time DateTime64(3, 'UTC') COMMENT 'Time of the inventory that showed it.',
    source LowCardinality(String) COMMENT 'What derived it.',
    node LowCardinality(String) COMMENT 'Node name.',
    change LowCardinality(String) COMMENT 'ADDED, MODIFIED or DELETED.',
    device_kind LowCardinality(String) COMMENT 'GPU or RDMA.',
    device_id String COMMENT 'GPU device_id, or RDMA name/port.',
    changed Array(String) COMMENT 'Fields that changed.',
    before Map(String, String) COMMENT 'Their old values.',
    after Map(String, String) COMMENT 'Their new values.'
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(event_time)
ORDER BY (cluster, node, device_id, event_time, event_id)
SETTINGS non_replicated_deduplication_window = 1000
COMMENT 'GPU and RDMA devices added, removed or changed (gpulens.changelog.devices.v1).';
