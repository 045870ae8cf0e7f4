"""The API's SQL: constant statements over the sink's tables, values only as bound parameters.

Every "current" statement is an "as of" statement: it takes ``{at:DateTime64(3, 'UTC')}``
and answers from history, per entity its newest event (by ``version``) with
``event_time <= at`` (TABLES.md, "As of" queries; DESIGN.md: the state after every event of
that instant). Without ``asOf`` the API binds :data:`END_OF_TIME`, so the newest state and
the state at an instant come from one statement, and the latest-state tables (``pods``,
``nodes`` FINAL) are what a test checks them against. Windowed tables answer with the newest
window that ended by ``at``. Fragments (the ``*_AT`` common table expressions) are joined
into statements here, once, at import; nothing a request sends is ever part of a statement.
"""

from __future__ import annotations

from datetime import UTC, datetime

END_OF_TIME = datetime(2100, 1, 1, tzinfo=UTC)
"""``at`` without ``asOf``: after every event (event times are bounded below 2100)."""
START_OF_TIME = datetime(2000, 1, 1, tzinfo=UTC)
"""The earliest event time there can be: the start of a range left open."""

AT = "{at:DateTime64(3, 'UTC')}"

NODES_AT = f"""nodes_at AS
(
    SELECT node, s.1 AS present, s.2 AS ready, s.3 AS schedulable, s.4 AS gpus_allocatable,
           s.5 AS gpu_model, s.6 AS gpu_vendor, last_seen
    FROM
    (
        SELECT node,
               argMax((type != 'DELETED', ready, schedulable, gpus_allocatable, gpu_model, gpu_vendor),
                      version) AS s,
               max(event_time) AS last_seen
        FROM node_events
        WHERE cluster = {{cluster:String}} AND event_time <= {AT}
        GROUP BY node
    )
)"""
"""Each node of ``{cluster}`` as of ``{at}`` (``present``: not deleted)."""

PODS_AT = f"""pods_at AS
(
    SELECT uid, s.1 AS namespace, s.2 AS name, s.3 AS node, s.4 AS phase, s.5 AS deleted,
           s.6 AS holds_gpus, s.7 AS gpu_amount, s.8 AS workload_uid, s.9 AS workload_kind,
           s.10 AS workload_name, s.11 AS creation_time, s.12 AS unschedulable_reason,
           s.13 AS unschedulable_message, s.14 AS owners, last_seen
    FROM
    (
        SELECT uid,
               argMax((namespace, name, node, phase, type = 'DELETED', holds_gpus, gpu_amount,
                       ifNull(workload_uid, uid),
                       if(empty(owners), 'Pod', tupleElement(owners[-1], 'kind')),
                       if(empty(owners), name, tupleElement(owners[-1], 'name')),
                       creation_time, unschedulable_reason, unschedulable_message, owners), version) AS s,
               max(event_time) AS last_seen
        FROM pod_events
        WHERE cluster = {{cluster:String}} AND event_time <= {AT}
        GROUP BY uid
    )
)"""
"""Each GPU pod of ``{cluster}`` as of ``{at}``; its workload is its top owner (a bare pod is its
own, kind ``Pod``), as the worker counts workloads."""

HELD_AT = """held_at AS
(
    SELECT assumeNotNull(node) AS held_node, sum(gpu_amount) AS gpus, count() AS pods
    FROM pods_at WHERE holds_gpus GROUP BY held_node
)"""
"""GPUs held and GPU pods running per node (needs ``pods_at``)."""

CLUSTERS = f"""\
SELECT cluster AS name, countIf(s.1) AS nodes, sumIf(s.4, s.1 AND s.2 AND s.3) AS gpu_capacity,
       max(last_seen) AS newest_event
FROM
(
    SELECT cluster, node, argMax((type != 'DELETED', ready, schedulable, gpus_allocatable), version) AS s,
           max(event_time) AS last_seen
    FROM node_events
    WHERE event_time <= {AT}
    GROUP BY cluster, node
)
GROUP BY cluster
ORDER BY cluster"""

LAST_OVERVIEW = f"""\
SELECT window_start, window_end, nodes_total, nodes_healthy, nodes_not_ready, nodes_cordoned,
       nodes_fully_idle, nodes_partially_idle, nodes_busy, gpu_capacity, gpus_allocated_avg,
       allocation_rate_avg, gpu_utilization_avg, gpu_samples
FROM cluster_overview FINAL
WHERE cluster = {{cluster:String}} AND window_end <= {AT}
ORDER BY window_start DESC
LIMIT 1"""
"""The newest cluster_overview window that ended by ``at``."""

LAST_ALLOCATION = f"""\
SELECT window_start, window_end, gpu_capacity, gpus_allocated_avg, gpus_allocated_max, gpus_allocated_end,
       allocation_rate_avg, pods_running_end, pods_pending_end
FROM cluster_gpu_allocation FINAL
WHERE cluster = {{cluster:String}} AND window_end <= {AT}
ORDER BY window_start DESC
LIMIT 1"""
"""The newest cluster_gpu_allocation window that ended by ``at``."""

FAULTY_NODES = f"""\
WITH {NODES_AT}
SELECT node, 'NotReady' AS reason, 0 AS gpus_lost FROM nodes_at WHERE present AND NOT ready
UNION ALL
SELECT assumeNotNull(s.2) AS node, 'GpuLost' AS reason, count() AS gpus_lost
FROM
(
    SELECT entity, argMax((state, node), (event_time, event_id)) AS s
    FROM alerts FINAL
    WHERE cluster = {{cluster:String}} AND alert = 'GpuLost' AND event_time <= {AT}
    GROUP BY entity
)
WHERE s.1 = 'OPENED' AND s.2 IS NOT NULL
GROUP BY node"""
"""Nodes NotReady, and nodes with GPUs lost (an open GpuLost alert), as of ``at``."""

CONSUMERS = f"""\
SELECT workload_uid AS uid, s.1 AS kind, s.2 AS name, s.3 AS namespace, s.4 AS window_start,
       s.5 AS window_end, s.6 AS gpus_held, s.7 AS gpus_allocated_avg, s.8 AS utilization_avg,
       s.9 AS utilization_max, s.10 AS pods
FROM
(
    SELECT workload_uid,
           argMax((workload_kind, workload_name, namespace, window_start, window_end, gpus_allocated_end,
                   gpus_allocated_avg, utilization_avg, utilization_max, pods_active_end), window_start) AS s
    FROM workload_gpu_usage FINAL
    WHERE cluster = {{cluster:String}} AND window_end <= {AT}
    GROUP BY workload_uid
)
WHERE gpus_held > 0
ORDER BY gpus_held DESC, uid"""
"""Workloads holding GPUs at the end of their newest window by ``at``, most GPUs first."""

IDLE_WORKLOADS = f"""\
SELECT workload_uid AS uid, any(workload_kind) AS kind, any(workload_name) AS name,
       any(workload_namespace) AS namespace, sum(held_h) AS gpu_hours,
       sumIf(held_h, util IS NOT NULL) AS measured_gpu_hours,
       sumIf(held_h * (1 - assumeNotNull(util) / 100), util IS NOT NULL) AS idle_gpu_hours,
       sum(util * n) / nullIf(sumIf(n, util IS NOT NULL), 0) AS utilization_avg,
       sum(n) AS samples, count() AS windows, max(ended) AS last_window_end
FROM
(
    SELECT workload_uid, workload_kind, workload_name, namespace AS workload_namespace,
           window_end AS ended, utilization_avg AS util, samples AS n,
           gpus_allocated_avg * dateDiff('millisecond', window_start, window_end) / 3600000 AS held_h
    FROM workload_gpu_usage FINAL
    WHERE cluster = {{cluster:String}} AND window_end <= {AT}
      AND window_start >= {{start:DateTime64(3, 'UTC')}} AND window_start < {{end:DateTime64(3, 'UTC')}}
      AND gpus_allocated_avg > 0
)
GROUP BY workload_uid
HAVING measured_gpu_hours > 0
ORDER BY idle_gpu_hours DESC, uid"""
"""Workloads by GPU-hours held but idle, most first, over their windows that started in
``[start, end)`` and ended by ``at``: per window, GPUs held x its hours x (1 - mean
utilization); a window without samples (utilization unknown) counts to ``gpu_hours`` only, and
a workload with no measured window is left out (nothing says it idles)."""

NEWEST_SAMPLE = """\
SELECT max(event_time) AS newest, count() AS samples
FROM gpu_samples
WHERE cluster = {cluster:String} AND ({node:Nullable(String)} IS NULL OR node = {node:Nullable(String)})"""
"""The newest GPU sample of a cluster (of one node, when ``node`` is bound): where a time range
left open ends."""

_SAMPLES_IN_RANGE = """\
FROM gpu_samples FINAL
WHERE cluster = {cluster:String} AND ({node:Nullable(String)} IS NULL OR node = {node:Nullable(String)})
  AND event_time >= {start:DateTime64(3, 'UTC')} AND event_time < {end:DateTime64(3, 'UTC')}"""

_BUCKET = "toStartOfInterval(event_time, toIntervalSecond({step:UInt32})) AS time"

GPU_HEATMAP = f"""\
SELECT node, gpu_index, {_BUCKET}, avg(utilization_pct) AS utilization, count() AS samples
{_SAMPLES_IN_RANGE}
GROUP BY node, gpu_index, time
ORDER BY node, gpu_index, time"""
"""Mean utilization per node, GPU and ``step``-second bucket in ``[start, end)``."""

GPU_METRICS = f"""\
SELECT gpu_index, device_id, {_BUCKET}, avg(utilization_pct) AS utilization,
       avg(memory_used_bytes) AS memory_used_bytes_avg, avg(power_watts) AS power_watts_avg,
       avg(temperature_junction_c) AS temperature_junction_c_avg, count() AS samples
{_SAMPLES_IN_RANGE}
GROUP BY gpu_index, device_id, time
ORDER BY gpu_index, device_id, time"""
"""Per GPU of a node and ``step``-second bucket: mean utilization, memory, power, temperature."""

UTILIZATION_HISTORY = f"""\
SELECT {_BUCKET}, avg(utilization_pct) AS utilization, count() AS samples
{_SAMPLES_IN_RANGE}
GROUP BY time
ORDER BY time"""
"""A node's mean GPU utilization (over its GPUs' samples) per ``step``-second bucket."""

NODES = f"""\
WITH {NODES_AT}, {PODS_AT}, {HELD_AT}
SELECT n.node AS name, n.ready AS ready, n.schedulable AS schedulable, n.gpu_model AS gpu_model,
       n.gpu_vendor AS gpu_vendor, n.gpus_allocatable AS gpus_allocatable, h.gpus AS gpus_allocated,
       h.pods AS pods_running, n.last_seen AS last_seen
FROM nodes_at AS n
LEFT JOIN held_at AS h ON n.node = h.held_node
WHERE n.present AND ({{node:Nullable(String)}} IS NULL OR n.node = {{node:Nullable(String)}})
ORDER BY name"""
"""The cluster's nodes as of ``at`` with the GPUs their pods hold (one node: bind ``node``)."""

NODE_AT = f"""\
SELECT * EXCEPT (version, event_id, resource_version)
FROM node_events
WHERE cluster = {{cluster:String}} AND node = {{node:String}} AND event_time <= {AT}
ORDER BY version DESC
LIMIT 1"""
"""One node's newest observation by ``at`` (every column)."""

NODE_GPU_DEVICES = f"""\
WITH
    present AS
    (
        SELECT device_id
        FROM
        (
            SELECT device_id, argMax(change, (event_time, event_id)) AS last_change
            FROM device_changelog FINAL
            WHERE cluster = {{cluster:String}} AND node = {{node:String}} AND device_kind = 'GPU'
              AND event_time <= {AT}
            GROUP BY device_id
        )
        WHERE last_change != 'DELETED'
    ),
    holders AS
    (
        SELECT tupleElement(d, 2) AS device_id, pod_namespace, pod_name, container_name
        FROM
        (
            SELECT pod_namespace, pod_name, container_name, argMax((type != 'DELETED', devices), version) AS s
            FROM container_events
            WHERE cluster = {{cluster:String}} AND node = {{node:String}} AND event_time <= {AT}
            GROUP BY pod_namespace, pod_name, container_name
        )
        ARRAY JOIN s.2 AS d
        WHERE s.1 AND tupleElement(d, 3) = 'GPU'
    )
SELECT g.device_id AS device_id, g.gpu_index AS gpu_index, g.vendor AS vendor, g.model AS model,
       g.uuid AS uuid, g.serial AS serial, g.bdf AS bdf, g.vram_total_bytes AS vram_total_bytes,
       g.driver_version AS driver_version, g.gpu_partition AS gpu_partition,
       h.pod_namespace AS pod_namespace, h.pod_name AS pod_name, h.container_name AS container_name
FROM gpu_devices AS g FINAL
LEFT JOIN holders AS h ON g.device_id = h.device_id
WHERE g.cluster = {{cluster:String}} AND g.node = {{node:String}}
  AND g.device_id IN (SELECT device_id FROM present)
ORDER BY gpu_index, device_id"""
"""A node's GPUs as of ``at`` (present: not removed by the device changelog), each with its
attributes as last inventoried and the container holding it then (by the device plugin's id)."""

NODE_WORKLOADS = f"""\
WITH {PODS_AT}
SELECT workload_uid AS uid, any(workload_kind) AS kind, any(workload_name) AS workload,
       any(namespace) AS ns, count() AS pods, sum(gpu_amount) AS gpus
FROM pods_at
WHERE holds_gpus AND node = {{node:String}}
GROUP BY workload_uid
ORDER BY gpus DESC, uid"""
"""Workloads whose pods hold GPUs of a node as of ``at``."""

NODE_WORKLOADS_HISTORY = """\
SELECT uid AS pod_uid, pod_namespace AS namespace, pod_name AS name, top_uid AS workload_uid,
       top_kind AS workload_kind, top_name AS workload_name, most_gpus AS gpu_amount, held_from,
       if(released.1 > held_from, released.1, NULL) AS held_until
FROM
(
    SELECT uid, any(namespace) AS pod_namespace, any(name) AS pod_name,
           any(ifNull(workload_uid, uid)) AS top_uid,
           any(if(empty(owners), 'Pod', tupleElement(owners[-1], 'kind'))) AS top_kind,
           any(if(empty(owners), name, tupleElement(owners[-1], 'name'))) AS top_name,
           max(gpu_amount) AS most_gpus,
           minIf(event_time, holds_gpus AND node = {node:String}) AS held_from,
           arraySort(groupArray((event_time, holds_gpus))) AS changes,
           arrayFirst(c -> NOT c.2 AND c.1 > held_from, changes) AS released
    FROM pod_events
    WHERE cluster = {cluster:String}
      AND uid IN (SELECT uid FROM pod_events
                  WHERE cluster = {cluster:String} AND node = {node:String} AND holds_gpus)
    GROUP BY uid
)
WHERE held_from < {end:DateTime64(3, 'UTC')}
  AND (released.1 <= held_from OR released.1 >= {start:DateTime64(3, 'UTC')})
ORDER BY held_from DESC, pod_uid"""
"""Pods that held GPUs of a node at some time in ``[start, end)``: from when, until when (null:
still holding at the newest event)."""

NODE_GPU_ALLOCATION = """\
SELECT window_start, window_end, gpu_model, gpu_capacity, gpus_allocated_avg, gpus_allocated_max,
       gpus_allocated_end, allocation_rate_avg, pods_running_end
FROM node_gpu_allocation FINAL
WHERE cluster = {cluster:String} AND node = {node:String}
  AND window_start >= {start:DateTime64(3, 'UTC')} AND window_start < {end:DateTime64(3, 'UTC')}
ORDER BY window_start"""
"""A node's node_gpu_allocation windows starting in ``[start, end)``."""

WORKLOADS = f"""\
WITH {PODS_AT}
SELECT uid, kind, workload AS name, ns AS namespace, status, pods, pods_running, gpus_held, created,
       newest AS last_seen
FROM
(
    SELECT workload_uid AS uid, any(workload_kind) AS kind, any(workload_name) AS workload,
           any(namespace) AS ns,
           multiIf(countIf(holds_gpus) > 0, 'Running',
                   countIf(NOT deleted AND phase = 'Pending') > 0, 'Pending',
                   countIf(phase = 'Failed') > 0, 'Failed', 'Done') AS status,
           countIf(NOT deleted) AS pods, countIf(holds_gpus) AS pods_running,
           sumIf(gpu_amount, holds_gpus) AS gpus_held, min(creation_time) AS created,
           max(last_seen) AS newest
    FROM pods_at
    WHERE {{uid:Nullable(String)}} IS NULL OR workload_uid = {{uid:Nullable(String)}}
    GROUP BY workload_uid
)
WHERE ({{namespace:Nullable(String)}} IS NULL OR namespace = {{namespace:Nullable(String)}})
  AND ({{kind:Nullable(String)}} IS NULL OR kind = {{kind:Nullable(String)}})
  AND ({{status:Nullable(String)}} IS NULL OR status = {{status:Nullable(String)}})
ORDER BY gpus_held DESC, created DESC, uid"""
"""Workloads (top owners of GPU pods; a bare pod is its own) as of ``at``, with their status
from their pods: Running (a pod holds GPUs), Pending (one waits), Failed (one failed), Done."""

WORKLOAD_PODS = f"""\
WITH {PODS_AT}
SELECT uid, namespace, name, node, phase, deleted, holds_gpus, gpu_amount, creation_time,
       unschedulable_reason, owners, last_seen
FROM pods_at
WHERE workload_uid = {{uid:String}}
ORDER BY creation_time, uid"""
"""A workload's pods as of ``at`` (deleted ones included, marked), with their owner chains."""

WORKLOAD_OBJECTS = f"""\
SELECT uid, s.1 AS kind, s.2 AS name, s.3 AS namespace, s.4 AS parent_uid, s.5 AS status,
       s.6 AS replicas, s.7 AS gpu_request
FROM
(
    SELECT uid, argMax((kind, name, namespace, parent_uid, status, replicas, gpu_request, type), version) AS s
    FROM workload_events
    WHERE cluster = {{cluster:String}} AND event_time <= {AT}
    GROUP BY uid
)
WHERE s.8 != 'DELETED'"""
"""The watched workload objects of a cluster as of ``at`` (Deployments, ReplicaSets, Jobs, ...),
with their parents: what a workload's hierarchy is made of."""

WORKLOAD_METRICS = """\
SELECT window_start, window_end, gpus_allocated_avg, gpus_allocated_max, gpus_allocated_end,
       utilization_avg, utilization_max, samples, pods_active_end
FROM workload_gpu_usage FINAL
WHERE cluster = {cluster:String} AND workload_uid = {uid:String}
  AND window_start >= {start:DateTime64(3, 'UTC')} AND window_start < {end:DateTime64(3, 'UTC')}
ORDER BY window_start"""
"""A workload's workload_gpu_usage windows starting in ``[start, end)``."""

ALERTS = f"""\
SELECT alert, entity, s.1 AS state, s.2 AS event_time, s.3 AS since, s.4 AS node, s.5 AS gpu_id,
       s.6 AS pod_uid, s.7 AS pod_namespace, s.8 AS pod_name, s.9 AS message, s.10 AS labels
FROM
(
    SELECT alert, entity,
           argMax((state, event_time, since, node, gpu_id, pod_uid, pod_namespace, pod_name, message, labels),
                  (event_time, event_id)) AS s
    FROM alerts FINAL
    WHERE cluster = {{cluster:String}} AND event_time <= {AT}
      AND ({{alert:Nullable(String)}} IS NULL OR alert = {{alert:Nullable(String)}})
    GROUP BY alert, entity
)
WHERE {{state:Nullable(String)}} IS NULL OR state = {{state:Nullable(String)}}
ORDER BY event_time DESC, alert, entity"""
"""Each alert (per rule and entity) in its state as of ``at``: opened or resolved last."""

NEWEST_POD_EVENT = """\
SELECT max(event_time) AS newest FROM pod_events WHERE cluster = {cluster:String}"""
"""The cluster's newest pod event: "now" in event time, from which pending pods' ages count."""

PENDING = f"""\
WITH
    {PODS_AT},
    pending_alerts AS
    (
        SELECT assumeNotNull(pod_uid) AS alerted_uid, argMax(labels, (event_time, event_id)) AS alert_labels
        FROM alerts FINAL
        WHERE cluster = {{cluster:String}} AND alert = 'GpuPodPending' AND state = 'OPENED'
          AND pod_uid IS NOT NULL AND event_time <= {AT}
        GROUP BY alerted_uid
    ),
    verdicts AS
    (
        SELECT judged_uid, v.1 AS reason_class, v.2 AS fits_after_consolidation, v.3 AS judged_at
        FROM
        (
            SELECT uid AS judged_uid,
                   argMax((reason_class, fits_after_consolidation, event_time), (event_time, event_id)) AS v
            FROM pending_gpu_pods FINAL
            WHERE cluster = {{cluster:String}} AND event_time <= {AT}
            GROUP BY judged_uid
        )
    )
SELECT p.uid AS uid, p.namespace AS namespace, p.name AS name, p.workload_uid AS workload_uid,
       p.workload_kind AS workload_kind, p.workload_name AS workload_name, p.gpu_amount AS gpus_requested,
       p.creation_time AS created, coalesce(p.unschedulable_reason, nullIf(a.alert_labels['reason'], ''))
       AS reason, p.unschedulable_message AS message, a.alert_labels AS alert_labels,
       v.judged_uid != '' AS judged, v.reason_class AS reason_class,
       v.fits_after_consolidation AS fits_after_consolidation, v.judged_at AS judged_at
FROM pods_at AS p
LEFT JOIN pending_alerts AS a ON p.uid = a.alerted_uid
LEFT JOIN verdicts AS v ON p.uid = v.judged_uid
WHERE NOT p.deleted AND p.node IS NULL AND p.phase = 'Pending' AND p.gpu_amount > 0
ORDER BY created, uid"""
"""GPU pods waiting unbound as of ``at``, with the scheduler's reason, their newest verdict by
then (pending_gpu_pods: reason class, fits after consolidation; none before the first window end
they waited over) and, once their GpuPodPending alert opened, the free GPUs by model it recorded."""

_USAGE_IN_RANGE = """\
WHERE u.cluster = {cluster:String}
  AND u.window_start >= {start:DateTime64(3, 'UTC')} AND u.window_start < {end:DateTime64(3, 'UTC')}
GROUP BY hour, group_key
ORDER BY hour, group_key"""

_HOURLY = """\
SELECT toStartOfHour(u.window_start) AS hour, {key} AS group_key, {label} AS group_label,
       sum(u.gpus_allocated_avg * dateDiff('millisecond', u.window_start, u.window_end)) / 3600000
           AS gpu_hours,
       sum(u.utilization_avg * u.samples) / nullIf(sumIf(u.samples, u.utilization_avg IS NOT NULL), 0)
           AS utilization_avg,
       quantileExactWeighted(0.5)(u.utilization_avg, u.samples) AS utilization_p50,
       quantileExactWeighted(0.95)(u.utilization_avg, u.samples) AS utilization_p95,
       max(u.utilization_max) AS utilization_max, sum(u.samples) AS samples,
       uniqExact(u.workload_uid) AS workloads
FROM workload_gpu_usage AS u FINAL"""

HOURLY_BY_NAMESPACE = _HOURLY.format(key="u.namespace", label="u.namespace") + "\n" + _USAGE_IN_RANGE
HOURLY_BY_WORKLOAD = (
    _HOURLY.format(key="u.workload_uid", label="any(u.workload_kind || '/' || u.workload_name)")
    + "\n"
    + _USAGE_IN_RANGE
)
HOURLY_BY_LABEL = (
    _HOURLY.format(key="l.label_value", label="l.label_value")
    + """
LEFT JOIN
(
    SELECT ifNull(workload_uid, uid) AS labelled_uid, any(labels[{label:String}]) AS label_value
    FROM pods FINAL
    WHERE cluster = {cluster:String}
    GROUP BY labelled_uid
) AS l ON u.workload_uid = l.labelled_uid
"""
    + _USAGE_IN_RANGE
)
"""GPU-hours held (GPUs held x window length), sample-weighted mean, p50 and p95 utilization
(quantiles of the windows' means, each weighted by its samples), max and sample counts, per
hour and namespace, workload, or value of a pod label (``{label}``; workloads without it
count under ""), from workload_gpu_usage (windows of an hour or less)."""

NODE_GPU_HEALTH = f"""\
SELECT device_id, s.1 AS gpu_index, s.2 AS vendor, s.3 AS healthy, s.4 AS conditions, s.5 AS cause,
       s.6 AS xid, s.7 AS counters, s.8 AS message, last_seen
FROM
(
    SELECT device_id,
           argMax((gpu_index, vendor, healthy, conditions, cause, xid, counters, message),
                  (event_time, event_id)) AS s,
           max(event_time) AS last_seen
    FROM gpu_health
    WHERE cluster = {{cluster:String}} AND node = {{node:String}} AND event_time <= {AT}
    GROUP BY device_id
)
ORDER BY gpu_index, device_id"""
"""Each GPU of ``{node}`` as its newest health event by ``{at}`` says (GPUs the agent never
reported health for are left out)."""


def _idle_in_range(owners: str) -> str:
    """FROM and WHERE of idle_gpu_hours rows of the cluster in ``[start, end)``: held rows
    (``owners`` = ``!= ''``) or the unallocated ones (``= ''``)."""
    return f"""\
FROM idle_gpu_hours AS i FINAL
WHERE i.cluster = {{cluster:String}} AND i.workload_uid {owners}
  AND i.window_start >= {{start:DateTime64(3, 'UTC')}} AND i.window_start < {{end:DateTime64(3, 'UTC')}}"""


def _idle_by(key: str, label: str) -> str:
    return f"""\
SELECT toStartOfHour(i.window_start) AS hour, {key} AS group_key, {label} AS group_label,
       sum(i.active_gpu_hours) AS active_gpu_hours, sum(i.idle_gpu_hours) AS idle_gpu_hours,
       sum(i.memory_idle_gpu_hours) AS memory_idle_gpu_hours,
       sum(i.unmeasured_gpu_hours) AS unmeasured_gpu_hours,
       active_gpu_hours + idle_gpu_hours + memory_idle_gpu_hours + unmeasured_gpu_hours AS held_gpu_hours,
       uniqExact(i.workload_uid) AS workloads
{_idle_in_range("!= ''")}
GROUP BY hour, group_key
ORDER BY hour, group_key"""


IDLE_BY_OWNER = {
    "workload": _idle_by("i.workload_uid", "any(i.workload_kind || '/' || i.workload_name)"),
    "namespace": _idle_by("i.namespace", "i.namespace"),
    "label": _idle_by("i.owner_labels[{label:String}]", "i.owner_labels[{label:String}]"),
}
"""GPU-hours held per hour and owner (workload, namespace, or value of a label the worker copies,
``{label}``: owners without it count under ""), split into active, idle, memory-idle and
unmeasured, from idle_gpu_hours."""

UNALLOCATED_BY_HOUR = f"""\
SELECT toStartOfHour(i.window_start) AS hour, sum(i.unallocated_gpu_hours) AS unallocated_gpu_hours
{_idle_in_range("= ''")}
GROUP BY hour
ORDER BY hour"""
"""GPU-hours of the cluster's reported GPUs that nobody held, per hour, from idle_gpu_hours."""

STORAGE_VOLUMES = f"""\
SELECT name, s.1 AS storage_kind, s.2 AS driver, s.3 AS storage_class, s.4 AS namespace, s.5 AS claim,
       s.6 AS node, s.7 AS mount_point, s.8 AS capacity_bytes, s.9 AS used_bytes, s.10 AS available_bytes,
       s.9 * 100 / nullIf(s.9 + s.10, 0) AS used_pct, last_seen
FROM
(
    SELECT name,
           argMax((storage_kind, driver, storage_class, namespace, claim, node, mount_point,
                   capacity_bytes, used_bytes, available_bytes, type = 'DELETED'), version) AS s,
           max(event_time) AS last_seen
    FROM storage_volume_events
    WHERE cluster = {{cluster:String}} AND event_time <= {AT}
    GROUP BY name
)
WHERE NOT s.11 AND ({{kind:Nullable(String)}} IS NULL OR s.1 = {{kind:Nullable(String)}})
ORDER BY storage_kind, name"""
"""The cluster's PersistentVolumes as of ``at`` (one kind: bind ``kind``): each one's newest
observation; ``used_pct`` as df reports it, used / (used + available)."""
