"""``/api/clusters``: the clusters, each one's overview, its GPU consumers, its workloads holding
idle GPUs, its GPU-hours by owner and kind, its GPU heatmap and its storage volumes."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query

from gpulens.api import queries
from gpulens.api.models import (
    Cluster,
    Consumer,
    HeatmapCell,
    IdleByOwner,
    IdleWorkload,
    Listing,
    Overview,
    Paged,
    Series,
    StorageVolume,
)
from gpulens.api.parameters import (
    GROUP_BY,
    AsOf,
    Db,
    Paging,
    SeriesAsked,
    Settings,
    Span,
    at,
    grouped,
    paged,
    series_answer,
)
from gpulens.consumers.clickhouse.queries import GPU_ALLOCATION_AS_OF

router = APIRouter(prefix="/clusters", tags=["clusters"])

ClusterName = Annotated[str, Path(min_length=1, description="Cluster name.")]


def _one(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    return rows[0] if rows else None


@router.get("", response_model=Listing[Cluster])
def clusters(db: Db, as_of: AsOf = None) -> dict[str, Any]:
    """Every cluster with nodes as of ``asOf``: nodes, GPU capacity, newest node event."""
    return {"asOf": as_of, "data": db.rows(queries.CLUSTERS, {"at": at(as_of)})}


@router.get("/{cluster}/overview", response_model=Overview)
def overview(cluster: ClusterName, db: Db, as_of: AsOf = None) -> dict[str, Any]:
    """Nodes fully idle, partly idle and busy, utilization (the newest cluster_overview window by
    ``asOf``); allocation rate (the newest cluster_gpu_allocation window); GPUs held at the
    instant itself (the "as of" query of TABLES.md); faulty nodes: NotReady or GPUs lost."""
    params = {"cluster": cluster, "at": at(as_of)}
    now = db.rows(GPU_ALLOCATION_AS_OF, params)[0]
    capacity = now["gpu_capacity"]
    faulty: dict[str, dict[str, Any]] = {}
    for row in db.rows(queries.FAULTY_NODES, params):
        node = faulty.setdefault(row["node"], {"node": row["node"], "reasons": [], "gpus_lost": 0})
        node["reasons"].append(row["reason"])
        node["gpus_lost"] += row["gpus_lost"]
    return {
        "cluster": cluster,
        "asOf": as_of,
        "nodes": _one(db.rows(queries.LAST_OVERVIEW, params)),
        "allocation": _one(db.rows(queries.LAST_ALLOCATION, params)),
        "now": {**now, "allocation_rate": now["gpus_allocated"] / capacity if capacity else None},
        "faulty_nodes": sorted(faulty.values(), key=lambda n: str(n["node"])),
    }


@router.get("/{cluster}/consumers", response_model=Paged[Consumer])
def consumers(
    cluster: ClusterName,
    db: Db,
    chosen: Paging,
    as_of: AsOf = None,
) -> dict[str, Any]:
    """Workloads holding GPUs (at the end of their newest window by ``asOf``), most GPUs first,
    with their mean utilization over that window."""
    rows, total = db.page(queries.CONSUMERS, {"cluster": cluster, "at": at(as_of)}, chosen)
    return paged(rows, total, chosen, asOf=as_of)


@router.get("/{cluster}/idleWorkloads", response_model=Paged[IdleWorkload])
def idle_workloads(
    cluster: ClusterName,
    db: Db,
    chosen: Paging,
    span: Span,
    as_of: AsOf = None,
) -> dict[str, Any]:
    """Workloads by GPU-hours held but idle (GPUs held x hours x (1 - mean utilization), window
    by window), most first: over their workload_gpu_usage windows that started in ``[start,
    end)`` (default: all) and ended by ``asOf``. The waste a person should look at first."""
    params = {"cluster": cluster, "at": at(as_of), "start": span.start, "end": span.end}
    rows, total = db.page(queries.IDLE_WORKLOADS, params, chosen)
    return paged(rows, total, chosen, asOf=as_of)


@router.get("/{cluster}/idleByOwner", response_model=IdleByOwner)
def idle_by_owner(
    cluster: ClusterName,
    db: Db,
    span: Span,
    group_by: Annotated[
        str,
        Query(
            alias="groupBy",
            pattern=GROUP_BY,
            description="workload, namespace, or label:KEY (a label in [pipeline] owner_labels).",
        ),
    ] = "workload",
) -> dict[str, Any]:
    """Per hour in ``[start, end)`` and owner: GPU-hours held, split into active, idle,
    memory-idle and unmeasured; and per hour the GPU-hours of reported GPUs nobody held. From
    idle_gpu_hours (the worker's ``idle`` processor)."""
    params: dict[str, object] = {"cluster": cluster, "start": span.start, "end": span.end}
    statement = grouped(queries.IDLE_BY_OWNER, group_by, params)
    return {
        "cluster": cluster,
        "groupBy": group_by,
        "data": db.rows(statement, params),
        "unallocated": db.rows(queries.UNALLOCATED_BY_HOUR, params),
    }


@router.get("/{cluster}/gpuHeatmap", response_model=Series[HeatmapCell])
def gpu_heatmap(
    cluster: ClusterName,
    db: Db,
    settings: Settings,
    chosen: SeriesAsked,
) -> dict[str, Any]:
    """Mean utilization per node, GPU and ``step`` over ``[start, end)`` (default: the hour
    before the cluster's newest sample)."""
    return series_answer(queries.GPU_HEATMAP, chosen, db, settings, cluster=cluster)


@router.get("/{cluster}/storage", response_model=Paged[StorageVolume])
def storage(
    cluster: ClusterName,
    db: Db,
    chosen: Paging,
    as_of: AsOf = None,
    kind: Annotated[
        str | None, Query(min_length=1, description="Only volumes of this storage_kind (nfs, juicefs, ...).")
    ] = None,
) -> dict[str, Any]:
    """The cluster's PersistentVolumes as of ``asOf``: kind (JuiceFS, NFS, Lustre, local, ...),
    driver, class, bound claim, capacity, and usage as the kubelets last measured it."""
    params = {"cluster": cluster, "at": at(as_of), "kind": kind}
    rows, total = db.page(queries.STORAGE_VOLUMES, params, chosen)
    return paged(rows, total, chosen, asOf=as_of)
