"""Pod events for state and window tests: the example PodEvent of a cluster, moved to a phase and time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpulens.schemas.model.models import ChangeType, OwnerReference, PodEvent
from gpulens.schemas.model.topics import PODS
from gpulens.testing.examples import example_events

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
DEPLOYMENT = OwnerReference(kind="Deployment", api_version="apps/v1", name="serve", uid="deploy-1")
REPLICASET = OwnerReference(kind="ReplicaSet", api_version="apps/v1", name="serve-7f9", uid="rs-1")


def at(second: int) -> datetime:
    return T0 + timedelta(seconds=second)


def pod(
    cluster: str,
    uid: str,
    phase: str,
    second: int,
    owners: list[OwnerReference],
    change: ChangeType = ChangeType.MODIFIED,
    gpu_amount: float = 2.0,
) -> PodEvent:
    template = example_events(cluster, at=T0)[PODS]
    assert isinstance(template, PodEvent)
    return template.model_copy(
        update={
            "event_id": f"{uid}-{second}-{phase}-{change.value}",
            "event_time": at(second),
            "uid": uid,
            "name": uid,
            "phase": phase,
            "type": change,
            "node": "node-a" if phase != "Pending" else None,
            "gpu_amount": gpu_amount,
            "owners": owners,
        }
    )


def leaving_at_a_window_start(cluster: str) -> list[PodEvent]:
    """Issue 14's example: p0 holds 2 GPUs from 0 and is deleted at exactly 3600; p1 holds 0.5
    from 100. With hour windows from T0, the window [3600, 7200) holds at most 0.5 GPUs: at its
    first instant p0 is gone already (the amount at an instant is after all of its events)."""
    return [
        pod(cluster, "p0", "Running", 0, [], gpu_amount=2.0),
        pod(cluster, "p1", "Running", 100, [], gpu_amount=0.5),
        pod(cluster, "p0", "Running", 3600, [], ChangeType.DELETED, gpu_amount=2.0),
    ]
