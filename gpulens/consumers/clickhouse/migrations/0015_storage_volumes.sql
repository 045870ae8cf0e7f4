-- Storage volumes as the Kubernetes watchers publish them (gpulens.storage.v1): one StorageEvent per
-- change of a PersistentVolume, its claim, its StorageClass or the usage the kubelets measure.
-- "Which volumes, of which kind, how full?" is storage_volumes FINAL with type != 'DELETED';
-- how a volume filled over time is storage_volume_events.

CREATE TABLE IF NOT EXISTS storage_volumes
(
    cluster LowCardinality(String) COMMENT 'Cluster name.',
    name String COMMENT 'PersistentVolume name: the entity key.',
    type LowCardinality(String) COMMENT 'ADDED, MODIFIED or DELETED: the last change seen.',
    storage_kind LowCardinality(String) COMMENT 'juicefs, nfs, lustre, hostpath, local, another in-tree type, or csi.',
    driver LowCardinality(Nullable(String)) COMMENT 'CSI driver or provisioner (csi.juicefs.com, nfs.csi.k8s.io, ...).',
    storage_class LowCardinality(Nullable(String)) COMMENT 'StorageClass name.',
    namespace LowCardinality(Nullable(String)) COMMENT 'Namespace of the bound claim.',
    claim Nullable(String) COMMENT 'Name of the bound PersistentVolumeClaim; null while unbound.',
    node LowCardinality(Nullable(String)) COMMENT 'Node of a local or hostPath volume.',
    mount_point Nullable(String) COMMENT 'Directory of a local or hostPath volume; server:/export of an NFS one.',
    capacity_bytes Nullable(Int64) COMMENT 'Capacity: the claim''s status.capacity, else the volume''s spec.capacity.',
    used_bytes Nullable(Int64) COMMENT 'Used bytes the kubelet measured (statfs of the mounted filesystem); null: never mounted.',
    available_bytes Nullable(Int64) COMMENT 'Available bytes the kubelet measured.',
    labels Map(String, String) COMMENT 'PersistentVolume labels.',
    event_id String COMMENT 'Deterministic id of the observation.',
    event_time DateTime64(3, 'UTC') COMMENT 'When the change happened (event time).',
    source LowCardinality(String) COMMENT 'What observed it.',
    version UInt128 COMMENT 'event_time ms * 2^64 + Kafka offset: the newest row wins.'
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (cluster, name)
SETTINGS non_replicated_deduplication_window = 1000
COMMENT 'Latest state of every PersistentVolume (from gpulens.storage.v1); read with FINAL.';

CREATE TABLE IF NOT EXISTS storage_volume_events AS storage_volumes
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(event_time)
ORDER BY (cluster, name, event_time, event_id)
SETTINGS non_replicated_deduplication_window = 1000
COMMENT 'Every volume observation (gpulens.storage.v1), per volume in event-time order.';
