"""``/api/nodes``: a cluster's nodes, each one's GPUs, what runs on them and their history."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path

from gpulens.api import queries
from gpulens.api.models import (
    Failure,
    GpuDevice,
    GpuHealth,
    GpuMetric,
    HeldPeriod,
    Listing,
    Node,
    NodeDetail,
    NodeWindow,
    NodeWorkload,
    Paged,
    Series,
    UtilizationPoint,
)
from gpulens.api.parameters import (
    AsOf,
    Cluster,
    Db,
    Paging,
    SeriesAsked,
    Settings,
    Span,
    at,
    paged,
    series_answer,
)

router = APIRouter(prefix="/nodes", tags=["nodes"])

NodeName = Annotated[str, Path(min_length=1, description="Node name.")]


@router.get("", response_model=Paged[Node])
def nodes(cluster: Cluster, db: Db, chosen: Paging, as_of: AsOf = None) -> dict[str, Any]:
    """The cluster's nodes as of ``asOf``: health, GPU model, GPUs offered and held, pods running."""
    params = {"cluster": cluster, "at": at(as_of), "node": None}
    rows, total = db.page(queries.NODES, params, chosen)
    return paged(rows, total, chosen, asOf=as_of)


@router.get(
    "/{name}",
    response_model=NodeDetail,
    responses={404: {"model": Failure, "description": "No such node by then."}},
)
def node(name: NodeName, cluster: Cluster, db: Db, as_of: AsOf = None) -> dict[str, Any]:
    """One node as last observed by ``asOf`` (every field), with the GPUs its pods hold then."""
    params = {"cluster": cluster, "at": at(as_of), "node": name}
    observed = db.rows(queries.NODE_AT, params)
    if not observed:
        raise HTTPException(status_code=404, detail=f"no node {name!r} in cluster {cluster!r} by then")
    held = db.rows(queries.NODES, params)
    usage = {k: held[0][k] for k in ("gpus_allocated", "pods_running")} if held else {}
    return {"asOf": as_of, **observed[0], **usage}


@router.get("/{name}/gpuDevices", response_model=Listing[GpuDevice])
def gpu_devices(name: NodeName, cluster: Cluster, db: Db, as_of: AsOf = None) -> dict[str, Any]:
    """The node's GPUs as of ``asOf`` and the container holding each (null: free)."""
    rows = db.rows(queries.NODE_GPU_DEVICES, {"cluster": cluster, "node": name, "at": at(as_of)})
    for row in rows:  # a free GPU joins no holder: ClickHouse's empty strings, shown as null
        for key in ("pod_namespace", "pod_name", "container_name"):
            row[key] = row[key] or None
    return {"asOf": as_of, "data": rows}


@router.get("/{name}/gpuHealth", response_model=Listing[GpuHealth])
def gpu_health(name: NodeName, cluster: Cluster, db: Db, as_of: AsOf = None) -> dict[str, Any]:
    """The node's GPUs as their newest health event by ``asOf`` says: healthy or the critical
    conditions holding (XID, uncorrectable ECC or RAS errors, ...) and the error counters."""
    rows = db.rows(queries.NODE_GPU_HEALTH, {"cluster": cluster, "node": name, "at": at(as_of)})
    return {"asOf": as_of, "data": rows}


@router.get("/{name}/gpuMetrics", response_model=Series[GpuMetric])
def gpu_metrics(
    name: NodeName,
    cluster: Cluster,
    db: Db,
    settings: Settings,
    chosen: SeriesAsked,
) -> dict[str, Any]:
    """Per GPU and ``step``: mean utilization, memory used, power, junction temperature over
    ``[start, end)`` (default: the hour before the node's newest sample)."""
    return series_answer(queries.GPU_METRICS, chosen, db, settings, cluster=cluster, node=name)


@router.get("/{name}/gpuUtilizationHistory", response_model=Series[UtilizationPoint])
def gpu_utilization_history(
    name: NodeName,
    cluster: Cluster,
    db: Db,
    settings: Settings,
    chosen: SeriesAsked,
) -> dict[str, Any]:
    """The node's mean GPU utilization per ``step`` over ``[start, end)``."""
    return series_answer(queries.UTILIZATION_HISTORY, chosen, db, settings, cluster=cluster, node=name)


@router.get("/{name}/workloads", response_model=Listing[NodeWorkload])
def node_workloads(name: NodeName, cluster: Cluster, db: Db, as_of: AsOf = None) -> dict[str, Any]:
    """Workloads whose pods hold the node's GPUs as of ``asOf``."""
    rows = db.rows(queries.NODE_WORKLOADS, {"cluster": cluster, "node": name, "at": at(as_of)})
    data = [
        {
            "uid": r["uid"],
            "kind": r["kind"],
            "name": r["workload"],
            "namespace": r["ns"],
            "pods": r["pods"],
            "gpus": r["gpus"],
        }
        for r in rows
    ]
    return {"asOf": as_of, "data": data}


@router.get("/{name}/workloadsHistory", response_model=Paged[HeldPeriod])
def node_workloads_history(
    name: NodeName,
    cluster: Cluster,
    db: Db,
    chosen: Paging,
    span: Span,
) -> dict[str, Any]:
    """Pods that held the node's GPUs at some time in ``[start, end)``, newest first: from when
    until when (``held_until`` null: holding at the newest event), and their workloads."""
    params = {"cluster": cluster, "node": name, "start": span.start, "end": span.end}
    rows, total = db.page(queries.NODE_WORKLOADS_HISTORY, params, chosen)
    return paged(rows, total, chosen)


@router.get("/{name}/gpuAllocation", response_model=Listing[NodeWindow])
def gpu_allocation(name: NodeName, cluster: Cluster, db: Db, span: Span) -> dict[str, Any]:
    """The node's allocation windows (node_gpu_allocation) starting in ``[start, end)``."""
    params = {"cluster": cluster, "node": name, "start": span.start, "end": span.end}
    return {"data": db.rows(queries.NODE_GPU_ALLOCATION, params)}
