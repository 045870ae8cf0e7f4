"""``/api/workloads``: workloads (top owners of GPU pods), each one's hierarchy, metrics, pods and
report over its life."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Path, Query

from gpulens.api import queries
from gpulens.api.models import Failure, Hierarchy, Listing, Paged, Pod, Workload, WorkloadNow, WorkloadWindow
from gpulens.api.parameters import AsOf, Cluster, Db, Paging, Span, at, paged
from gpulens.api.reading import Reader
from gpulens.api.workload_report import IDLE_BELOW, WorkloadReport, workload_report

router = APIRouter(prefix="/workloads", tags=["workloads"])

Uid = Annotated[str, Path(min_length=1, description="Workload uid (a bare pod's is its own uid).")]
Status = Literal["Running", "Pending", "Failed", "Done"]


def _filters(
    uid: str | None = None, namespace: str | None = None, kind: str | None = None, status: str | None = None
) -> dict[str, str | None]:
    return {"uid": uid, "namespace": namespace, "kind": kind, "status": status}


@router.get("", response_model=Paged[Workload])
def workloads(
    cluster: Cluster,
    db: Db,
    chosen: Paging,
    namespace: Annotated[str | None, Query(min_length=1, description="Only this namespace.")] = None,
    kind: Annotated[str | None, Query(min_length=1, description="Only this kind (Pod: bare pods).")] = None,
    status: Annotated[Status | None, Query(description="Only workloads in this status.")] = None,
    as_of: AsOf = None,
) -> dict[str, Any]:
    """Workloads as of ``asOf``, most GPUs held first; status from their pods: Running (one holds
    GPUs), Pending (one waits), Failed (one failed), Done."""
    params = {"cluster": cluster, "at": at(as_of), **_filters(namespace=namespace, kind=kind, status=status)}
    rows, total = db.page(queries.WORKLOADS, params, chosen)
    return paged(rows, total, chosen, asOf=as_of)


def _workload(db: Reader, cluster: str, uid: str, as_of: AsOf) -> dict[str, Any]:
    found = db.rows(queries.WORKLOADS, {"cluster": cluster, "at": at(as_of), **_filters(uid=uid)})
    if not found:
        raise HTTPException(status_code=404, detail=f"no workload {uid!r} in cluster {cluster!r} by then")
    return found[0]


@router.get(
    "/{uid}",
    response_model=WorkloadNow,
    responses={404: {"model": Failure, "description": "No such workload by then."}},
)
def workload(uid: Uid, cluster: Cluster, db: Db, as_of: AsOf = None) -> dict[str, Any]:
    """One workload as of ``asOf``: kind, name, status, pods, GPUs held."""
    return {"asOf": as_of, **_workload(db, cluster, uid, as_of)}


@router.get(
    "/{uid}/hierarchy",
    response_model=Hierarchy,
    responses={404: {"model": Failure, "description": "No such workload by then."}},
)
def hierarchy(uid: Uid, cluster: Cluster, db: Db, as_of: AsOf = None) -> dict[str, Any]:
    """The workload's tree as of ``asOf``: its watched child objects (a Deployment's
    ReplicaSets, ...) and, under its direct owner, each pod."""
    top = _workload(db, cluster, uid, as_of)
    params = {"cluster": cluster, "at": at(as_of), "uid": uid}
    objects = {row["uid"]: row for row in db.rows(queries.WORKLOAD_OBJECTS, params)}
    nodes: dict[str, dict[str, Any]] = {}

    def grow(node_uid: str, kind: str, name: str, depth: int) -> dict[str, Any]:
        node: dict[str, Any] = {"uid": node_uid, "kind": kind, "name": name, "children": [], "pods": []}
        nodes[node_uid] = node
        if depth < 8:  # owner chains are short; a cycle in bad data stops here
            for child in objects.values():
                if child["parent_uid"] == node_uid and child["uid"] not in nodes:
                    node["children"].append(grow(child["uid"], child["kind"], child["name"], depth + 1))
        return node

    root = grow(uid, top["kind"], top["name"], 0)
    for pod in db.rows(queries.WORKLOAD_PODS, params):
        owners = pod.pop("owners")
        direct = owners[0][3] if owners else None  # (kind, api_version, name, uid), direct owner first
        if pod["uid"] == uid:  # a bare pod is the workload itself
            root["pods"].append(pod)
            continue
        nodes.get(direct or "", root)["pods"].append(pod)
    return {"asOf": as_of, **root}


@router.get("/{uid}/metrics", response_model=Listing[WorkloadWindow])
def metrics(uid: Uid, cluster: Cluster, db: Db, span: Span) -> dict[str, Any]:
    """The workload's windows (workload_gpu_usage) starting in ``[start, end)``: GPUs held,
    utilization, samples, active pods."""
    params = {"cluster": cluster, "uid": uid, "start": span.start, "end": span.end}
    return {"data": db.rows(queries.WORKLOAD_METRICS, params)}


@router.get("/{uid}/pods", response_model=Listing[Pod])
def pods(uid: Uid, cluster: Cluster, db: Db, as_of: AsOf = None) -> dict[str, Any]:
    """The workload's pods as of ``asOf`` (deleted ones marked), oldest first."""
    rows = db.rows(queries.WORKLOAD_PODS, {"cluster": cluster, "at": at(as_of), "uid": uid})
    for row in rows:
        del row["owners"]
    return {"asOf": as_of, "data": rows}


@router.get(
    "/{uid}/report",
    response_model=WorkloadReport,
    responses={404: {"model": Failure, "description": "No pod of this workload in the cluster."}},
)
def report(
    uid: Uid,
    cluster: Cluster,
    db: Db,
    idle_below: Annotated[
        float, Query(alias="idleBelow", ge=0, description="Utilization (%) under which a GPU held is idle.")
    ] = IDLE_BELOW,
) -> WorkloadReport:
    """The workload over its whole life, as jobstats reports a job: GPU-hours, mean and p95
    utilization, idle GPU-hours, time pending, restarts and interruptions, energy, its pods and
    GPUs (`gpulens report workload UID` prints the same)."""
    found = workload_report(db, cluster=cluster, uid=uid, idle_below=idle_below)
    if found is None:
        raise HTTPException(status_code=404, detail=f"no workload {uid!r} in cluster {cluster!r}")
    return found
