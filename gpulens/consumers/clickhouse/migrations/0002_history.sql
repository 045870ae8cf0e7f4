-- History: every observation, append-only, so that any "as of T" question can be answered.
-- Same columns as the latest-state tables; event_id ends the sorting key, so a re-delivered
-- event is stored once after merges (count with FINAL).

CREATE TABLE IF NOT EXISTS node_events AS nodes
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(event_time)
ORDER BY (cluster, node, event_time, event_id)
SETTINGS non_replicated_deduplication_window = 1000
COMMENT 'Every node observation (gpulens.nodes.v1), per node in event-time order.';

CREATE TABLE IF NOT EXISTS pod_events AS pods
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(event_time)
ORDER BY (cluster, uid, event_time, event_id)
SETTINGS non_replicated_deduplication_window = 1000
COMMENT 'Every GPU pod observation (gpulens.pods.v1), per pod in event-time order.';

CREATE TABLE IF NOT EXISTS workload_events AS workloads
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(event_time)
ORDER BY (cluster, uid, event_time, event_id)
SETTINGS non_replicated_deduplication_window = 1000
COMMENT 'Every workload observation (gpulens.workloads.v1), per workload in event-time order.';

CREATE TABLE IF NOT EXISTS container_events AS containers
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(event_time)
ORDER BY (cluster, node, pod_namespace, pod_name, container_name, event_time, event_id)
SETTINGS non_replicated_deduplication_window = 1000
COMMENT 'Every container observation with its devices (gpulens.containers.v1).';
