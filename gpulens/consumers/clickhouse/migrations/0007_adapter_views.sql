-- Primus-SaFE's adapter tables, as views over GPULens's tables, so its readers keep working.

CREATE VIEW IF NOT EXISTS node_statistic
COMMENT 'Primus-SaFE node_statistic: mean GPU utilization of each node over the 5 minutes before its newest sample.'
AS
SELECT s.cluster AS cluster, s.node AS node, avg(s.utilization_pct) AS gpu_utilization, max(s.event_time) AS updated_at
FROM gpu_samples AS s
INNER JOIN
(
    SELECT cluster, node, max(event_time) AS newest FROM gpu_samples GROUP BY cluster, node
) AS n ON s.cluster = n.cluster AND s.node = n.node
WHERE s.event_time > n.newest - INTERVAL 5 MINUTE
GROUP BY s.cluster, s.node;

CREATE VIEW IF NOT EXISTS workload_statistic
COMMENT 'Primus-SaFE workload_statistic: each workload as of its newest workload_gpu_usage window.'
AS
SELECT
    cluster,
    workload_uid,
    argMax(workload_kind, window_start) AS workload_kind,
    argMax(workload_name, window_start) AS workload_name,
    argMax(namespace, window_start) AS namespace,
    argMax(gpus_allocated_end, window_start) AS gpu_allocated,
    argMax(utilization_avg, window_start) AS gpu_utilization,
    argMax(pods_active_end, window_start) AS active_pods,
    max(window_end) AS updated_at
FROM workload_gpu_usage FINAL
GROUP BY cluster, workload_uid;
