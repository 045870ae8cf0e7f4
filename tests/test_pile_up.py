"""GpuPendingPileUp: GPU pods pile up pending while GPUs sit held but idle (the Focus-Server incident).

The GenAI duty cycles give real idle stretches (41 one-GPU pods); GPU pods that never get a node
are added to the same cluster, a few minutes apart. The oracle recomputes the alert from the
CSV and the added pods alone: a GPU is idle-held between the GpuIdle opening and resolution the
CSV says (alert_oracle, checked against the CSV in test_alerting); an added pod counts from the
first instant of the stream at or after ``created + pending_for`` until it is deleted; after the
last event of each instant the pile-up holds when at least ``pods`` count and ``idle`` GPUs are
idle, and the alert opens and resolves at the instants where that changes.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta

from alert_oracle import SAMPLES, idle_alerts_from_csv

from gpulens.pipeline.alerting import AlertDetector, AlertRules
from gpulens.producers.replay import genai_duty
from gpulens.schemas.model.models import AlertState, ChangeType, Event, PodEvent
from gpulens.schemas.model.topics import PODS
from gpulens.testing.examples import example_events

PENDING_FOR_S, PODS_NEEDED, IDLE_NEEDED = 300.0, 3, 2


def waiting_pod(uid: str, at: datetime, change: ChangeType) -> PodEvent:
    template = example_events("genai", at=at)[PODS]
    assert isinstance(template, PodEvent)
    return template.model_copy(
        update={
            "event_id": f"{uid}-{change.value}",
            "uid": uid,
            "name": uid,
            "namespace": "queue",
            "phase": "Pending",
            "node": None,
            "type": change,
            "gpu_amount": 1.0,
            "creation_time": at if change is ChangeType.ADDED else template.creation_time,
        }
    )


def stream() -> tuple[list[Event], list[tuple[float, float]]]:
    """The duty-cycle replay with pending pods merged in; each added pod's (created, deleted)."""
    replay = [event for _, event in genai_duty.plan(genai_duty.read_samples(SAMPLES), cluster="genai")]
    opened = sorted(t for _, state, t in idle_alerts_from_csv(5.0, 600.0) if state == "OPENED")
    lives = []
    for k, first in enumerate(opened[:: max(len(opened) // 6, 1)][:6]):
        created = first - 900 + 120 * k + 0.5  # between samples, which fall on whole seconds
        lives += [(created + 60 * j, created + 60 * j + 1800 + 300 * j) for j in range(4)]
    added: list[Event] = []
    for n, (created, deleted) in enumerate(lives):
        uid = f"queued-{n}"
        added.append(waiting_pod(uid, datetime.fromtimestamp(created, UTC), ChangeType.ADDED))
        deleted_pod = waiting_pod(uid, datetime.fromtimestamp(deleted, UTC), ChangeType.DELETED)
        added.append(deleted_pod.model_copy(update={"creation_time": datetime.fromtimestamp(created, UTC)}))
    merged = sorted(replay + added, key=lambda e: e.event_time)  # stable: the replay's order kept
    return merged, lives


def expected(events: list[Event], lives: list[tuple[float, float]]) -> list[tuple[str, float]]:
    instants = sorted({e.event_time.timestamp() for e in events})
    change: dict[float, int] = defaultdict(int)
    for _, state, t in idle_alerts_from_csv(5.0, 600.0):
        change[t] += 1 if state == "OPENED" else -1
    pending: dict[float, int] = defaultdict(int)
    for created, deleted in lives:
        due = next(t for t in instants if t >= created + PENDING_FOR_S)
        if due < deleted:
            pending[due] += 1
            pending[deleted] -= 1
    idle = waiting = 0
    piled, flips = False, []
    for t in instants[:-1]:  # the last instant is judged only when time moves past it
        idle += change.get(t, 0)
        waiting += pending.get(t, 0)
        now = waiting >= PODS_NEEDED and idle >= IDLE_NEEDED
        if now != piled:
            flips.append(("OPENED" if now else "RESOLVED", t))
            piled = now
    return flips


def test_pile_up_opens_and_resolves_where_the_csv_and_the_queued_pods_say() -> None:
    events, lives = stream()
    detector = AlertDetector(
        AlertRules(pending_for_s=PENDING_FOR_S, pile_up_pods=PODS_NEEDED, pile_up_idle_gpus=IDLE_NEEDED)
    )
    alerts = [a for e in events for a in detector.process(e) if a.alert == "GpuPendingPileUp"]
    flips = expected(events, lives)
    assert len(flips) >= 4, "the queued pods pile up more than once"
    assert [(a.state.value, a.event_time.timestamp()) for a in alerts] == flips
    opened = [a for a in alerts if a.state is AlertState.OPENED]
    assert all(int(a.labels["pending_pods"]) >= PODS_NEEDED for a in opened)
    assert all(int(a.labels["idle_gpus"]) >= IDLE_NEEDED for a in opened)
    assert all(a.entity == "genai" and a.since == a.event_time for a in opened)


def test_no_pile_up_without_idle_gpus() -> None:
    """Pods pending long on a cluster whose GPUs are busy are GpuPodPending, not a pile-up."""
    detector = AlertDetector(AlertRules(pending_for_s=60.0, pile_up_pods=2, pile_up_idle_gpus=1))
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    kinds = []
    for n in range(4):
        kinds += [
            a.alert
            for a in detector.process(waiting_pod(f"p{n}", t0 + timedelta(seconds=n), ChangeType.ADDED))
        ]
    later = waiting_pod("p0", t0 + timedelta(minutes=10), ChangeType.MODIFIED)
    kinds += [a.alert for a in detector.process(later)]
    kinds += [
        a.alert
        for a in detector.process(
            later.model_copy(update={"event_time": later.event_time + timedelta(seconds=1)})
        )
    ]
    assert kinds.count("GpuPodPending") == 4 and "GpuPendingPileUp" not in kinds
