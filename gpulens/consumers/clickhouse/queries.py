"""Documented "as of" queries over the history tables (TABLES.md shows them; a test keeps both equal).

Both take ``{cluster:String}`` and ``{at:DateTime64(3, 'UTC')}``. "At T" follows DESIGN.md:
the state after every event with ``event_time <= T``. Each entity's state is its newest
event by ``version`` (event time in ms, then Kafka offset); re-delivered duplicates do not
change an ``argMax``, so no ``FINAL`` is needed.
"""

from __future__ import annotations

__all__ = ["GPU_ALLOCATION_AS_OF", "PODS_RUNNING_AS_OF"]

PODS_RUNNING_AS_OF = """\
SELECT uid, state.1 AS namespace, state.2 AS name, state.3 AS node, state.4 AS gpu_amount
FROM
(
    SELECT uid, argMax((namespace, name, node, gpu_amount, holds_gpus), version) AS state
    FROM pod_events
    WHERE cluster = {cluster:String} AND event_time <= {at:DateTime64(3, 'UTC')}
    GROUP BY uid
)
WHERE state.5
ORDER BY uid"""
"""GPU pods holding GPUs at ``at``: bound, Running, not deleted (uid, namespace, name, node, gpu_amount)."""

GPU_ALLOCATION_AS_OF = """\
WITH
    pods_at AS
    (
        SELECT argMax((holds_gpus, gpu_amount, node IS NULL AND type != 'DELETED'
                       AND phase = 'Pending'), version) AS s
        FROM pod_events
        WHERE cluster = {cluster:String} AND event_time <= {at:DateTime64(3, 'UTC')}
        GROUP BY uid
    ),
    nodes_at AS
    (
        SELECT argMax((type != 'DELETED' AND ready AND schedulable, gpus_allocatable), version) AS s
        FROM node_events
        WHERE cluster = {cluster:String} AND event_time <= {at:DateTime64(3, 'UTC')}
        GROUP BY node
    )
SELECT
    (SELECT sumIf(s.2, s.1) FROM nodes_at) AS gpu_capacity,
    (SELECT sumIf(s.2, s.1) FROM pods_at) AS gpus_allocated,
    (SELECT countIf(s.1) FROM pods_at) AS pods_running,
    (SELECT countIf(s.3) FROM pods_at) AS pods_pending"""
"""Capacity, GPUs held, GPU pods running and pending at ``at`` (DESIGN.md definitions)."""


ADAPTER_VIEWS = ("node_statistic", "workload_statistic")
"""Views that give Primus-SaFE's adapter tables (migration 0007)."""

DERIVED_TABLES = ("workload_pods", "workload_pods_from_pods", "gpu_pod_waits")
"""Kept by ClickHouse itself from the sink's tables (a table and the materialized view feeding
it; the waits of GPU pods, a view of migration 0012)."""
