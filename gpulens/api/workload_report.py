"""One workload over its whole life, in the manner of Princeton's jobstats: GPU-hours held,
utilization (mean and p95), GPU time held idle, time pending, restarts and interruptions,
energy, and the pods and GPUs it held.

A query over the sink's tables, no table of its own: ``pod_events`` (each pod's life, as
segments from one observation to the next), ``container_events`` (which GPUs its containers
held) and ``gpu_samples`` (what those GPUs did meanwhile); ``workload_pods`` finds a
workload's pods (a bare pod is its own workload). Every statement is constant SQL with bound
parameters (``{cluster}``, ``{uid}``, ``{now}``, ``{idle_below}``, ``{span_max}``); the API
(``/api/workloads/{uid}/report``) and `gpulens report workload` both answer with
:func:`workload_report`.

The definitions, in event time (the same answers for a replay as for the live run):

- A pod's observation holds from its ``event_time`` to the pod's next observation; the last
  one holds until ``now``, the newest event of the cluster (pod events and GPU samples): a pod
  still running at the end holds its GPUs until then.
- **GPU-hours**: over the segments where the pod holds GPUs (DESIGN.md), its GPU amount times
  their hours. **Time pending**: the segments where it is Pending and not yet bound.
- A GPU sample speaks for its GPU from its time until the GPU's next sample, for
  :data:`SPAN_MAX_S` at most (Prometheus' staleness: beyond it the time is unmeasured). The
  part of that span inside a segment where the pod holds the GPU counts for the pod, weighted
  by the pod's share of each of its GPUs (GPU amount / GPUs its containers list on the node:
  1 for whole GPUs, the fraction of a shared one). **Idle GPU-hours** are the weighted spans of
  samples under ``idle_below``; **measured GPU-hours** those of samples with a utilization;
  **energy** is power times the weighted span, for samples that carry power.
- **Mean and p95 utilization** are over the samples taken while the pod held the GPU
  (p95 by linear interpolation, ClickHouse's ``quantileExactInclusive``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from gpulens.api.reading import Reader

__all__ = [
    "IDLE_BELOW",
    "SPAN_MAX_S",
    "ContainerExit",
    "ReportGpu",
    "ReportPod",
    "WorkloadReport",
    "clusters_of",
    "workload_report",
]

IDLE_BELOW = 5.0
"""Utilization (%) under which a GPU held counts as idle: the GpuIdle alert's default."""
SPAN_MAX_S = 300
"""How long one GPU sample speaks for its GPU at most, seconds (Prometheus' staleness)."""

CLUSTERS_OF = """\
SELECT cluster FROM workload_pods WHERE workload_uid = {uid:String}
UNION DISTINCT
SELECT cluster FROM pod_events WHERE uid = {uid:String}
ORDER BY cluster"""
"""The clusters where ``uid`` is a workload (a top owner of pods, or a bare pod)."""

NEWEST_EVENT = """\
SELECT greatest((SELECT max(event_time) FROM pod_events WHERE cluster = {cluster:String}),
                (SELECT max(event_time) FROM gpu_samples WHERE cluster = {cluster:String})) AS now"""
"""The cluster's newest event (pod events, GPU samples): where a hold still open ends."""

_SEGMENTS = """\
pods_of AS
(
    SELECT pod_uid FROM workload_pods WHERE cluster = {cluster:String} AND workload_uid = {uid:String}
    UNION DISTINCT
    SELECT {uid:String}
),
segments AS
(
    SELECT *, ifNull(next_start, {now:DateTime64(3, 'UTC')}) AS seg_end, next_start IS NULL AS open_end,
           phase = 'Pending' AND node IS NULL AND type != 'DELETED' AS pending
    FROM
    (
        SELECT uid, namespace, name, node, type, phase, holds_gpus, gpu_amount, containers, conditions,
               creation_time, owners, version, event_time AS seg_start,
               leadInFrame(toNullable(event_time)) OVER pod_order AS next_start
        FROM pod_events FINAL
        WHERE cluster = {cluster:String} AND uid IN (SELECT pod_uid FROM pods_of)
        WINDOW pod_order AS (PARTITION BY uid ORDER BY version ROWS BETWEEN CURRENT ROW AND 1 FOLLOWING)
    )
)"""
"""Each observation of the workload's pods, from its time to the pod's next one, or to ``now``
(``open_end``: a sample taken at ``now`` still counts for a pod holding then)."""

POD_LIVES = f"""\
WITH {_SEGMENTS}
SELECT uid, any(namespace) AS namespace, argMax(name, version) AS name,
       argMax(if(empty(owners), 'Pod', tupleElement(owners[-1], 'kind')), version) AS workload_kind,
       argMax(if(empty(owners), name, tupleElement(owners[-1], 'name')), version) AS workload_name,
       arraySort(groupUniqArrayIf(assumeNotNull(node), node IS NOT NULL)) AS nodes,
       argMax(phase, version) AS phase, argMax(type = 'DELETED', version) AS deleted,
       argMax(holds_gpus, version) AS holds_gpus, argMax(pending, version) AS pending_now,
       max(gpu_amount) AS gpu_amount, min(creation_time) AS created,
       min(seg_start) AS first_seen, max(seg_start) AS last_seen,
       sumIf(gpu_amount * dateDiff('millisecond', seg_start, seg_end), holds_gpus) / 3600000 AS gpu_hours,
       sumIf(dateDiff('millisecond', seg_start, seg_end), pending) / 1000 AS pending_s,
       max(arraySum(c -> tupleElement(c, 'restart_count'), containers)) AS restarts,
       arraySort(groupUniqArrayArray(arrayMap(
           c -> ifNull(tupleElement(c, 'reason'), 'DisruptionTarget'),
           arrayFilter(c -> tupleElement(c, 'type') = 'DisruptionTarget'
                            AND tupleElement(c, 'status') = 'True', conditions)))) AS disruptions,
       arraySort(groupUniqArrayArray(arrayMap(
           c -> (tupleElement(c, 'name'), tupleElement(c, 'reason'), tupleElement(c, 'exit_code')),
           arrayFilter(c -> tupleElement(c, 'state') = 'terminated'
                            AND (tupleElement(c, 'exit_code') IS NOT NULL
                                 OR tupleElement(c, 'reason') IS NOT NULL), containers)))) AS exits
FROM segments
GROUP BY uid
ORDER BY created, uid
SETTINGS prefer_column_name_to_alias = 1"""
"""Each pod of the workload over its life: GPU-hours held, time pending, restarts (the highest
sum of its containers' restart counts), disruptions (reasons of DisruptionTarget conditions:
preemption, eviction, ...) and container exits seen (container, reason, exit code). Its columns
are named as the table's, so ``prefer_column_name_to_alias``: inside an aggregate, ``name`` or
``gpu_amount`` is the table's column, not the alias of another aggregate."""

_SPANS = f"""\
WITH
{_SEGMENTS},
held_by AS
(
    SELECT DISTINCT assumeNotNull(node) AS held_node, namespace, name
    FROM pod_events
    WHERE cluster = {{cluster:String}} AND uid IN (SELECT pod_uid FROM pods_of) AND holds_gpus
),
devices AS
(
    SELECT held_node, namespace, name, device_id,
           count() OVER (PARTITION BY held_node, namespace, name) AS gpus
    FROM
    (
        SELECT DISTINCT node AS held_node, pod_namespace AS namespace, pod_name AS name,
               tupleElement(d, 'device_id') AS device_id
        FROM container_events
        ARRAY JOIN devices AS d
        WHERE cluster = {{cluster:String}} AND tupleElement(d, 'kind') = 'GPU'
          AND (node, pod_namespace, pod_name) IN held_by
    )
),
gpus AS
(
    SELECT h.uid AS uid, h.name AS name, h.held_node AS held_node, d.device_id AS device_id,
           h.gpu_amount / d.gpus AS share, h.seg_start AS seg_start, h.seg_end AS seg_end,
           h.open_end AS open_end
    FROM
    (
        SELECT uid, name, namespace, assumeNotNull(node) AS held_node, gpu_amount, seg_start, seg_end,
               open_end
        FROM segments
        WHERE holds_gpus AND node IS NOT NULL AND seg_end > seg_start
    ) AS h
    INNER JOIN devices AS d ON h.held_node = d.held_node AND h.namespace = d.namespace AND h.name = d.name
),
samples AS
(
    SELECT node, device_id, event_time, utilization_pct, power_watts,
           least(ifNull(leadInFrame(toNullable(event_time)) OVER gpu_order, far), far) AS span_end
    FROM
    (
        SELECT node, device_id, event_time, utilization_pct, power_watts,
               event_time + toIntervalSecond({{span_max:UInt32}}) AS far
        FROM gpu_samples FINAL
        WHERE cluster = {{cluster:String}} AND (node, device_id) IN (SELECT held_node, device_id FROM devices)
          AND event_time >= (SELECT min(event_time) FROM pod_events
                             WHERE cluster = {{cluster:String}} AND uid IN (SELECT pod_uid FROM pods_of)
                               AND holds_gpus) - toIntervalSecond({{span_max:UInt32}})
          AND event_time <= {{now:DateTime64(3, 'UTC')}}
    )
    WINDOW gpu_order AS
        (PARTITION BY node, device_id ORDER BY event_time ROWS BETWEEN CURRENT ROW AND 1 FOLLOWING)
),
spans AS
(
    SELECT g.uid AS uid, g.name AS name, g.held_node AS held_node, g.device_id AS device_id,
           s.event_time AS sampled, s.utilization_pct AS utilization, s.power_watts AS power,
           s.event_time >= g.seg_start AND (s.event_time < g.seg_end OR g.open_end) AS inside,
           g.share * dateDiff('millisecond', greatest(s.event_time, g.seg_start),
                              least(s.span_end, g.seg_end)) / 1000 AS weighted_s
    FROM gpus AS g
    INNER JOIN samples AS s ON s.node = g.held_node AND s.device_id = g.device_id
    WHERE (s.event_time < g.seg_end OR (g.open_end AND s.event_time = g.seg_end)) AND s.span_end > g.seg_start
)"""
"""Each sample of a GPU the workload held, with the part of its span inside a hold (weighted by
the pod's share of the GPU) and whether it was taken inside the hold."""

GPU_USE = f"""\
{_SPANS}
SELECT uid AS pod_uid, any(name) AS pod_name, held_node AS node, device_id,
       countIf(inside AND utilization IS NOT NULL) AS samples,
       avgIf(utilization, inside) AS utilization_avg,
       quantileExactInclusiveIf(0.95)(utilization, inside) AS utilization_p95,
       sumIf(weighted_s, utilization IS NOT NULL) / 3600 AS measured_gpu_hours,
       sumIf(weighted_s, utilization < {{idle_below:Float64}}) / 3600 AS idle_gpu_hours,
       if(countIf(power IS NOT NULL) > 0, sumIf(assumeNotNull(power) * weighted_s, power IS NOT NULL), NULL)
           AS energy_j,
       maxIf(sampled, inside) AS last_sample
FROM spans
GROUP BY GROUPING SETS ((uid, held_node, device_id), ())
ORDER BY empty(pod_uid), node, device_id, pod_uid"""
"""Per pod and GPU it held: samples, mean and p95 utilization, measured and idle GPU-hours,
energy, newest sample; then the same over all of them, in a last row whose ``pod_uid`` is empty
(or null, where ``group_by_use_nulls`` is set)."""


class ContainerExit(BaseModel):
    container: str
    reason: str | None
    exit_code: int | None


class ReportPod(BaseModel):
    uid: str
    namespace: str
    name: str
    nodes: list[str] = Field(description="Nodes it was bound to.")
    phase: str = Field(description="Its phase when last seen.")
    deleted: bool
    gpu_amount: float = Field(description="GPUs it asks for (shares as fractions).")
    created: datetime
    first_seen: datetime
    last_seen: datetime = Field(description="Its newest observation.")
    gpu_hours: float
    pending_s: float = Field(description="Seconds pending (not yet bound).")
    restarts: int = Field(description="Its containers' restarts.")
    disruptions: list[str] = Field(
        description="Reasons of its DisruptionTarget conditions (preemption, ...)."
    )
    exits: list[ContainerExit] = Field(description="Container exits seen (terminated with a reason or code).")


class ReportGpu(BaseModel):
    pod_uid: str
    pod_name: str
    node: str
    device_id: str
    samples: int = Field(description="Samples taken while the pod held it.")
    utilization_avg: float | None
    utilization_p95: float | None
    measured_gpu_hours: float = Field(description="Its GPU-hours held that samples speak for.")
    idle_gpu_hours: float = Field(description="Of those, under idle_below.")
    energy_j: float | None = Field(description="Joules while held (null: no sample carries power).")


class WorkloadReport(BaseModel):
    """A workload over its life (gpulens/api/workload_report.py gives the definitions)."""

    cluster: str
    uid: str
    kind: str = Field(description="Its top owner's kind (Pod: a bare pod).")
    name: str
    namespace: str
    status: str = Field(description="Running, Pending, Failed or Done (from its pods when last seen).")
    first_seen: datetime
    last_seen: datetime = Field(description="Its newest pod event or GPU sample taken while held.")
    now: datetime = Field(description="The cluster's newest event: holds still open count until it.")
    idle_below: float = Field(description="Utilization (%) under which a GPU held counts as idle.")
    gpu_hours: float = Field(description="GPUs held x hours.")
    measured_gpu_hours: float = Field(description="Of those, the GPU-hours GPU samples speak for.")
    idle_gpu_hours: float = Field(description="Of those, with utilization under idle_below.")
    utilization_avg: float | None = Field(description="Mean of the samples of its GPUs while held, %.")
    utilization_p95: float | None = Field(description="Their 95th percentile, %.")
    samples: int
    pending_s: float = Field(description="Seconds its pods spent pending (not yet bound), summed.")
    pods: int
    pods_failed: int = Field(description="Pods whose last phase is Failed.")
    pods_disrupted: int = Field(
        description="Pods with a DisruptionTarget condition (preempted, evicted, ...)."
    )
    restarts: int = Field(description="Container restarts over its pods.")
    container_exits: int = Field(description="Container exits seen over its pods.")
    energy_j: float | None = Field(
        description="Joules of its GPUs while held (null: no power in the samples)."
    )
    pod_list: list[ReportPod]
    gpu_list: list[ReportGpu]


_USE = ("samples", "utilization_avg", "utilization_p95", "measured_gpu_hours", "idle_gpu_hours", "energy_j")
"""The totals :data:`GPU_USE` gives the report."""


def clusters_of(reader: Reader, uid: str) -> list[str]:
    """The clusters in which ``uid`` is a workload."""
    return [row["cluster"] for row in reader.rows(CLUSTERS_OF, {"uid": uid})]


def _status(pods: list[dict[str, Any]]) -> str:
    if any(p["holds_gpus"] for p in pods):
        return "Running"
    if any(p["pending_now"] for p in pods):
        return "Pending"
    return "Failed" if any(p["phase"] == "Failed" for p in pods) else "Done"


def _pod(row: dict[str, Any]) -> ReportPod:
    exits = [ContainerExit(container=c, reason=r, exit_code=e) for c, r, e in row["exits"]]
    return ReportPod(**{**row, "exits": exits})


def workload_report(
    reader: Reader, *, cluster: str, uid: str, idle_below: float = IDLE_BELOW
) -> WorkloadReport | None:
    """The report of workload ``uid`` of ``cluster``; None when no pod of it was ever seen."""
    now = reader.rows(NEWEST_EVENT, {"cluster": cluster})[0]["now"]
    params = {"cluster": cluster, "uid": uid, "now": now, "idle_below": idle_below, "span_max": SPAN_MAX_S}
    pods = reader.rows(POD_LIVES, params)
    if not pods:
        return None
    *gpus, totals = reader.rows(GPU_USE, params)
    top = pods[-1]  # the newest pod's owner chain names the workload as it is now
    return WorkloadReport(
        cluster=cluster,
        uid=uid,
        kind=top["workload_kind"],
        name=top["workload_name"],
        namespace=top["namespace"],
        status=_status(pods),
        first_seen=min(p["first_seen"] for p in pods),
        last_seen=max(totals["last_sample"], *(p["last_seen"] for p in pods)),
        now=now,
        idle_below=idle_below,
        gpu_hours=sum(p["gpu_hours"] for p in pods),
        pending_s=sum(p["pending_s"] for p in pods),
        pods=len(pods),
        pods_failed=sum(p["phase"] == "Failed" for p in pods),
        pods_disrupted=sum(bool(p["disruptions"]) for p in pods),
        restarts=sum(p["restarts"] for p in pods),
        container_exits=sum(len(p["exits"]) for p in pods),
        **{name: totals[name] for name in _USE},
        pod_list=[_pod(p) for p in pods],
        gpu_list=[ReportGpu(**g) for g in gpus],
    )
