"""Kueue's queued workloads: the watcher reads kueue.x-k8s.io Workloads where the API server
serves them, and a Workload its queue has not admitted (its Job suspended, no pod yet) waits
as one pending entry of class ``not_admitted``, in the queue's words, until it is admitted.

The fixtures (tests/fixtures/kueue/, see its README) have Kueue's v1beta1 shape: two written by
hand (a Workload's life from pending to admitted) and three captured from real Kueue
installations in public kubernetes-sigs/kueue issues (a whole pending Workload, a whole admitted
GPU Workload, and a GPU Workload's pending status). What each should become is read off the JSON
here: the GPUs its pod sets ask (count x per-pod GPUs), its controller owner, its conditions and
the message of its False QuotaReserved condition.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Histogram
from watcher_support import node, template

from gpulens.pipeline.pending_waits import WAIT_BUCKETS_S, PendingWaits
from gpulens.pipeline.windows import TumblingWindows
from gpulens.producers.kubernetes import GpuCatalog, Translator
from gpulens.producers.kubernetes.resources import KUEUE_WORKLOADS
from gpulens.producers.kubernetes.settings import WatcherSettings
from gpulens.schemas.model.models import ChangeType, WorkloadEvent
from gpulens.testing.fake_kube import FakeKube

FIXTURES = Path(__file__).parent / "fixtures" / "kueue"
WAITED = timedelta(minutes=25)
LABELS = ("cluster", "namespace", "outcome")


def load(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return loaded


def gpus_asked(workload: dict[str, Any]) -> float:
    return sum(
        pod_set["count"] * float(container["resources"]["requests"].get("nvidia.com/gpu", 0))
        for pod_set in workload["spec"]["podSets"]
        for container in pod_set["template"]["spec"]["containers"]
    )


def queue_message(workload: dict[str, Any]) -> str:
    (reserved,) = [c for c in workload["status"]["conditions"] if c["type"] == "QuotaReserved"]
    assert reserved["status"] == "False"
    message: str = reserved["message"]
    return message


def created(workload: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(workload["metadata"]["creationTimestamp"])


def pending_with(status_fixture: str | None) -> dict[str, Any]:
    """The hand-written pending Workload, with the status of ``status_fixture`` when one is named."""
    pending = load("workload-pending.json")
    return pending if status_fixture is None else {**pending, "status": load(status_fixture)["status"]}


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    """An API server with Kueue's CRDs installed."""
    with FakeKube(kueue=True) as fake:
        yield fake


def test_a_watcher_publishes_a_queued_workload_not_admitted_then_admitted(
    kube, start_watcher, published
) -> None:
    pending, admitted = load("workload-pending.json"), load("workload-admitted.json")
    meta = pending["metadata"]
    (owner,) = meta["ownerReferences"]
    job = {"metadata": {"name": owner["name"], "namespace": meta["namespace"], "uid": owner["uid"]}}
    kube.create("jobs", {**job, "spec": {"suspend": True, "parallelism": 3, "template": template("2")}})
    kube.create("workloads", pending)
    start_watcher()

    events = published.wait(("WorkloadEvent", meta["name"], ChangeType.ADDED))
    (queued,) = [e for e in events if isinstance(e, WorkloadEvent) and e.name == meta["name"]]
    assert (queued.group, queued.kind, queued.uid) == ("kueue.x-k8s.io", "Workload", meta["uid"])
    assert queued.parent_uid == owner["uid"]
    assert queued.gpu_request == gpus_asked(pending) == 6
    assert queued.admitted is False
    assert queued.admission_message == queue_message(pending)

    kube.update("workloads", meta["name"], lambda o: o.update(status=admitted["status"]), namespace="team-a")
    events = published.wait(("WorkloadEvent", meta["name"], ChangeType.MODIFIED))
    now = [e for e in events if isinstance(e, WorkloadEvent) and e.name == meta["name"]][-1]
    assert now.admitted is True and now.admission_message is None


def test_a_workload_captured_from_a_real_kueue_is_published_as_not_admitted_in_its_queues_words(
    kube, start_watcher, published
) -> None:
    """kubernetes-sigs/kueue issue #5039's `kubectl get workload -o yaml` (Kueue v0.11.3): a Job's
    Workload of 2 pods (1 CPU each, no GPU), held by its queue (topology-aware scheduling found no
    domain)."""
    captured = load("workload-kueue-issue-5039.json")
    meta = captured["metadata"]
    (owner,) = [o for o in meta["ownerReferences"] if o.get("controller")]
    (pod_set,) = captured["spec"]["podSets"]
    job = {"metadata": {"name": owner["name"], "namespace": meta["namespace"], "uid": owner["uid"]}}
    spec = {"suspend": True, "parallelism": pod_set["count"], "template": pod_set["template"]}
    kube.create("jobs", {**job, "spec": spec})
    kube.create("workloads", captured)
    start_watcher()

    events = published.wait(("WorkloadEvent", meta["name"], ChangeType.ADDED))
    (queued,) = [e for e in events if isinstance(e, WorkloadEvent) and e.name == meta["name"]]
    assert (queued.namespace, queued.uid, queued.parent_uid) == (meta["namespace"], meta["uid"], owner["uid"])
    assert (queued.group, queued.kind) == ("kueue.x-k8s.io", "Workload")
    assert queued.replicas == pod_set["count"] == 2
    assert queued.gpu_request == gpus_asked(captured) == 0
    assert queued.creation_time == created(captured)
    assert queued.labels == meta["labels"]
    assert queued.admitted is False
    assert queued.admission_message == queue_message(captured)
    assert queued.admission_message.startswith("couldn't assign flavors to pod set main: no topology")


def test_an_admitted_gpu_workload_captured_from_a_real_kueue_is_admitted_with_its_gpus() -> None:
    """kubernetes-sigs/kueue issue #2213's Workload (Kueue v0.6.2 on GKE, a plain Pod asking one
    nvidia-l4 GPU, admitted after a ProvisioningRequest): its True Admitted condition makes it
    admitted, with no message; its pod set asks 1 GPU; its controller is the Pod."""
    captured = load("workload-kueue-issue-2213.json")
    meta = captured["metadata"]
    (owner,) = [o for o in meta["ownerReferences"] if o.get("controller")]
    conditions = {c["type"]: c["status"] for c in captured["status"]["conditions"]}
    assert conditions == {"QuotaReserved": "True", "Admitted": "True"}
    translator = Translator("c", "kubernetes", GpuCatalog.from_settings(WatcherSettings()))
    event = translator.workload(KUEUE_WORKLOADS, captured, change=ChangeType.ADDED, at=created(captured))
    assert (event.uid, event.namespace, event.name) == (meta["uid"], meta["namespace"], meta["name"])
    assert (owner["kind"], event.parent_uid) == ("Pod", owner["uid"])
    assert event.gpu_request == gpus_asked(captured) == 1
    assert event.replicas == sum(p["count"] for p in captured["spec"]["podSets"]) == 1
    assert event.admitted is True and event.admission_message is None


@pytest.mark.parametrize("status_fixture", [None, "status-kueue-issue-3909.json"])
def test_a_workload_its_queue_has_not_admitted_waits_as_not_admitted_until_admitted(
    status_fixture: str | None,
) -> None:
    """Also with the pending status a real Kueue wrote for a GPU PyTorchJob (kubernetes-sigs/kueue
    issue #3909: two pod sets, a message of several lines in the YAML) on the hand-written Workload."""
    pending, admitted = pending_with(status_fixture), load("workload-admitted.json")
    translator = Translator("c", "kubernetes", GpuCatalog.from_settings(WatcherSettings()))
    start = created(pending)
    registry = CollectorRegistry()
    waits = PendingWaits(
        TumblingWindows(60_000),
        waits=Histogram(
            "w", "test", ("cluster", "namespace", "outcome"), buckets=WAIT_BUCKETS_S, registry=registry
        ),
    )
    events = [
        translator.node(node("n1"), change=ChangeType.ADDED, at=start),
        translator.workload(KUEUE_WORKLOADS, pending, change=ChangeType.ADDED, at=start),
        translator.workload(
            KUEUE_WORKLOADS, admitted, change=ChangeType.MODIFIED, at=start + timedelta(minutes=25)
        ),
    ]
    rows = []
    for event in events:
        for window in waits.advance(event):
            rows += window
        rows += waits.process(event)

    (row,) = rows  # judged at the first window's end; admitted before the next
    assert (row.uid, row.name, row.namespace) == (
        pending["metadata"]["uid"],
        pending["metadata"]["name"],
        pending["metadata"]["namespace"],
    )
    assert row.reason_class == "not_admitted", "8 GPUs free on n1: the queue, not the room, holds it"
    assert row.scheduler_message == queue_message(pending)
    assert row.gpus_requested == gpus_asked(pending)
    assert row.gpus_free == 8
    labels = {"cluster": "c", "namespace": "team-a", "outcome": "admitted"}
    assert registry.get_sample_value("w_count", labels) == 1
    assert registry.get_sample_value("w_sum", labels) == WAITED.total_seconds()
