-- Which pods each workload has (and had): one row per workload and pod, whatever the number
-- of times the pod was observed. Primus-Lens kept these references in a table that collected
-- duplicates and inflated GPU allocation; here the key is the pair, and the newest state wins.

CREATE TABLE IF NOT EXISTS workload_pods
(
    cluster LowCardinality(String) COMMENT 'Cluster name.',
    workload_uid String COMMENT 'uid of the top owner of the pod (owners[-1]).',
    workload_kind LowCardinality(String) COMMENT 'Kind of the top owner, e.g. PyTorchJob, Deployment.',
    workload_name String COMMENT 'Name of the top owner.',
    namespace LowCardinality(String) COMMENT 'Namespace.',
    pod_uid String COMMENT 'Pod uid.',
    pod_name String COMMENT 'Pod name.',
    node LowCardinality(Nullable(String)) COMMENT 'Node the pod is bound to; null while pending.',
    phase LowCardinality(String) COMMENT 'Pending, Running, Succeeded, Failed or Unknown.',
    holds_gpus Bool COMMENT 'Bound, Running, not deleted and asking for GPUs (DESIGN.md).',
    gpu_amount Float64 COMMENT 'GPUs the pod holds or asks for (shares as fractions).',
    deleted Bool COMMENT 'The pod was deleted (its last observation was DELETED).',
    creation_time DateTime64(3, 'UTC') COMMENT 'When the pod was created.',
    last_seen DateTime64(3, 'UTC') COMMENT 'Event time of the newest observation.',
    version UInt128 COMMENT 'The pod row''s version: the newest observation wins.'
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (cluster, workload_uid, pod_uid)
COMMENT 'Pods of every workload, newest state per pair (from pods); read with FINAL.';

CREATE MATERIALIZED VIEW IF NOT EXISTS workload_pods_from_pods TO workload_pods
AS SELECT
    cluster,
    assumeNotNull(workload_uid) AS workload_uid,
    owners[-1].kind AS workload_kind,
    owners[-1].name AS workload_name,
    namespace,
    uid AS pod_uid,
    name AS pod_name,
    node,
    phase,
    holds_gpus,
    gpu_amount,
    type = 'DELETED' AS deleted,
    creation_time,
    event_time AS last_seen,
    version
FROM pods
WHERE workload_uid IS NOT NULL;

INSERT INTO workload_pods
SELECT
    cluster, assumeNotNull(workload_uid), owners[-1].kind, owners[-1].name, namespace, uid, name, node,
    phase, holds_gpus, gpu_amount, type = 'DELETED', creation_time, event_time, version
FROM pods FINAL
WHERE workload_uid IS NOT NULL;
