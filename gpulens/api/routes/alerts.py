"""``/api/alerts`` and ``/api/pending``: alerts in their state as of an instant, GPU pods waiting."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query

from gpulens.api import queries
from gpulens.api.models import Alert, Paged, Pending
from gpulens.api.parameters import AsOf, Cluster, Db, Paging, at, paged, utc

router = APIRouter(tags=["alerts"])

STATES = {"open": "OPENED", "resolved": "RESOLVED"}
AlertName = Literal[
    "GpuIdle",
    "GpuPodPending",
    "GpuPendingPileUp",
    "NodeNotReady",
    "GpuLost",
    "GpuUnhealthy",
    "GpuTelemetryStale",
]


@router.get("/alerts", response_model=Paged[Alert])
def alerts(
    cluster: Cluster,
    db: Db,
    chosen: Paging,
    state: Annotated[
        Literal["open", "resolved"] | None, Query(description="Only alerts open (or resolved) then.")
    ] = None,
    alert: Annotated[AlertName | None, Query(description="Only this rule.")] = None,
    as_of: AsOf = None,
) -> dict[str, Any]:
    """Each alert (rule and entity: a GPU, pod or node) in its state as of ``asOf``, newest
    change first; ``labels`` hold its details (reason, free GPUs by model, ...)."""
    params = {"cluster": cluster, "at": at(as_of), "alert": alert, "state": STATES[state] if state else None}
    rows, total = db.page(queries.ALERTS, params, chosen)
    return paged(rows, total, chosen, asOf=as_of)


def _by_model(labels: dict[str, str], prefix: str) -> dict[str, float]:
    return {key[len(prefix) :]: float(value) for key, value in labels.items() if key.startswith(prefix)}


@router.get("/pending", response_model=Pending)
def pending(cluster: Cluster, db: Db, as_of: AsOf = None) -> dict[str, Any]:
    """GPU pods waiting unbound as of ``asOf`` (default: the cluster's newest event), oldest
    first: the scheduler's reason, how long they have waited, why they wait (reason class and
    whether consolidation would make room, as judged at the last window end), and, once their
    GpuPodPending alert opened, the free GPUs by model (and the most free on one node) when
    they waited."""
    now = (
        utc(as_of)
        if as_of is not None
        else db.rows(queries.NEWEST_POD_EVENT, {"cluster": cluster})[0]["newest"]
    )
    data = []
    for row in db.rows(queries.PENDING, {"cluster": cluster, "at": at(as_of)}):
        labels = row.pop("alert_labels")
        if not row.pop("judged"):  # no verdict yet: the LEFT JOIN's defaults mean nothing
            row |= {"reason_class": None, "fits_after_consolidation": None, "judged_at": None}
        data.append(
            {
                **row,
                "age_s": (now - row["created"]).total_seconds(),
                "free_gpus": _by_model(labels, "free_gpus.") if labels else None,
                "max_free_on_one_node": _by_model(labels, "max_free_on_one_node.") if labels else None,
            }
        )
    return {"asOf": as_of, "now": now, "data": data}
