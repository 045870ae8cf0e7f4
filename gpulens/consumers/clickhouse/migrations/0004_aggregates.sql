-- Aggregates written by the allocation worker, with the exact columns of DESIGN.md.
-- One row per (cluster[, node], window_start): a re-delivered row is stored once.

CREATE TABLE IF NOT EXISTS cluster_gpu_allocation
(
    cluster LowCardinality(String) COMMENT 'Cluster name.',
    window_start DateTime64(3, 'UTC') COMMENT 'Window start (inclusive).',
    window_end DateTime64(3, 'UTC') COMMENT 'Window end (exclusive).',
    gpu_capacity Float64 COMMENT 'Allocatable GPUs of Ready, schedulable nodes at window end.',
    gpus_allocated_avg Float64 COMMENT 'Time-weighted mean of GPUs held over the window.',
    gpus_allocated_max Float64 COMMENT 'Most GPUs held at any instant of the window.',
    gpus_allocated_end Float64 COMMENT 'GPUs held at window end.',
    allocation_rate_avg Nullable(Float64) COMMENT 'gpus_allocated_avg / gpu_capacity; null when capacity is 0.',
    pods_running_end UInt32 COMMENT 'GPU pods holding GPUs at window end.',
    pods_pending_end UInt32 COMMENT 'GPU pods that exist but are not bound at window end.'
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(window_start)
ORDER BY (cluster, window_start)
SETTINGS non_replicated_deduplication_window = 1000
COMMENT 'GPU allocation per cluster and window (gpulens.agg.cluster-gpu-allocation.v1).';

CREATE TABLE IF NOT EXISTS node_gpu_allocation
(
    cluster LowCardinality(String) COMMENT 'Cluster name.',
    node LowCardinality(String) COMMENT 'Node name.',
    gpu_model LowCardinality(Nullable(String)) COMMENT 'GPU model of the node.',
    window_start DateTime64(3, 'UTC') COMMENT 'Window start (inclusive).',
    window_end DateTime64(3, 'UTC') COMMENT 'Window end (exclusive).',
    gpu_capacity Float64 COMMENT 'Allocatable GPUs if the node is Ready and schedulable, else 0.',
    gpus_allocated_avg Float64 COMMENT 'Time-weighted mean of GPUs held over the window.',
    gpus_allocated_max Float64 COMMENT 'Most GPUs held at any instant of the window.',
    gpus_allocated_end Float64 COMMENT 'GPUs held at window end.',
    allocation_rate_avg Nullable(Float64) COMMENT 'gpus_allocated_avg / gpu_capacity; null when capacity is 0.',
    pods_running_end UInt32 COMMENT 'GPU pods holding GPUs on this node at window end.',
    pods_pending_end UInt32 COMMENT 'Always 0: pending pods have no node yet.'
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(window_start)
ORDER BY (cluster, node, window_start)
SETTINGS non_replicated_deduplication_window = 1000
COMMENT 'GPU allocation per node and window (gpulens.agg.node-gpu-allocation.v1).';
