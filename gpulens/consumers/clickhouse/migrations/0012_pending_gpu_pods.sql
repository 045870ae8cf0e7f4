-- Why GPU pods wait: the worker's verdicts (gpulens.agg.pending-gpu-pods.v1), one row each time a
-- pending pod's verdict changes at a window's end. A pod's verdict as of T is its newest row by T.

CREATE TABLE IF NOT EXISTS pending_gpu_pods
(
    event_id String COMMENT 'cluster, pod uid and window end.',
    cluster LowCardinality(String) COMMENT 'Cluster name.',
    event_time DateTime64(3, 'UTC') COMMENT 'The window end it was judged at.',
    source LowCardinality(String) COMMENT 'What judged it.',
    uid String COMMENT 'Pod uid.',
    namespace LowCardinality(String) COMMENT 'Namespace.',
    name String COMMENT 'Pod name.',
    created DateTime64(3, 'UTC') COMMENT 'Its creationTimestamp.',
    waited_s Float64 COMMENT 'Seconds it had waited at event_time.',
    gpus_requested Float64 COMMENT 'Its GPU amount.',
    reason_class LowCardinality(String) COMMENT 'insufficient_gpus, fragmentation, taint_or_affinity, node_unavailable, quota, not_admitted or unknown.',
    scheduler_reason Nullable(String) COMMENT 'The scheduler''s reason.',
    scheduler_message Nullable(String) COMMENT 'The scheduler''s message.',
    gpus_free Float64 COMMENT 'Free GPUs on the Ready, schedulable nodes it may use.',
    max_free_on_one_node Float64 COMMENT 'The most of them free on one node.',
    fits_after_consolidation Bool COMMENT 'It fits now, or moving pods off one node makes room.'
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(event_time)
ORDER BY (cluster, uid, event_time, event_id)
SETTINGS non_replicated_deduplication_window = 1000
COMMENT 'Why GPU pods wait: verdicts as they change (gpulens.agg.pending-gpu-pods.v1).';

-- How long GPU pods waited, for wait-time histograms per cluster and namespace: one row per GPU
-- pod from its newest state, its wait ending when it was bound (or deleted unbound).
CREATE VIEW IF NOT EXISTS gpu_pod_waits
COMMENT 'How long each GPU pod waited unbound: bound, deleted while waiting, or still waiting (no wait_s).'
AS
SELECT
    cluster,
    namespace,
    uid,
    name,
    workload_uid,
    gpu_amount,
    creation_time AS created,
    multiIf(scheduled_time IS NOT NULL, 'bound', type = 'DELETED', 'deleted', 'waiting') AS outcome,
    if(scheduled_time IS NOT NULL, scheduled_time, if(type = 'DELETED', coalesce(deletion_time, event_time), NULL))
        AS ended,
    dateDiff('millisecond', creation_time, ended) / 1000 AS wait_s
FROM pods FINAL
WHERE gpu_amount > 0;
