"""``/api/gpu-aggregation/hourly``: GPU-hours held and utilization per hour and group."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from gpulens.api import queries
from gpulens.api.models import Hourly
from gpulens.api.parameters import GROUP_BY, Cluster, Db, Span, grouped

router = APIRouter(prefix="/gpu-aggregation", tags=["gpu-aggregation"])

BY_GROUP = {
    "namespace": queries.HOURLY_BY_NAMESPACE,
    "workload": queries.HOURLY_BY_WORKLOAD,
    "label": queries.HOURLY_BY_LABEL,
}


@router.get("/hourly", response_model=Hourly)
def hourly(
    cluster: Cluster,
    db: Db,
    span: Span,
    group_by: Annotated[
        str,
        Query(
            alias="groupBy",
            pattern=GROUP_BY,
            description="namespace, workload, or label:KEY (a pod label's value).",
        ),
    ] = "namespace",
) -> dict[str, Any]:
    """Per hour in ``[start, end)`` and group: GPU-hours held, mean, p50 and p95 utilization
    (quantiles of the windows' means weighted by their samples), max, sample counts, workloads.
    From workload_gpu_usage, whose windows must be an hour or shorter (the demo's are an hour)."""
    params: dict[str, object] = {"cluster": cluster, "start": span.start, "end": span.end}
    return {"groupBy": group_by, "data": db.rows(grouped(BY_GROUP, group_by, params), params)}
