"""Alerts in event time: GpuIdle against the GenAI duty cycles, and the other rules on small stories."""

from __future__ import annotations

import csv
from datetime import UTC, datetime, timedelta

import pytest
from alert_oracle import SAMPLES, idle_alerts_from_csv, stale_alerts_from_csv

from gpulens.pipeline.alerting import AlertDetector, AlertRules
from gpulens.pipeline.device_changes import diff
from gpulens.producers.replay import genai_duty
from gpulens.schemas.model.models import Alert, AlertState, ChangeType, DeviceKind
from gpulens.schemas.model.topics import DEVICE_INVENTORY, NODES, PODS
from gpulens.testing.examples import example_events


def test_gpu_idle_opens_and_resolves_exactly_as_the_csv_says() -> None:
    detector = AlertDetector(AlertRules(idle_below_pct=5.0, idle_for_s=600.0))
    alerts: list[Alert] = []
    for _, event in genai_duty.plan(genai_duty.read_samples(SAMPLES), cluster="genai"):
        alerts += detector.process(event)
    with SAMPLES.open() as handle:
        pod_of_gpu = {
            genai_duty.gpu_id(row["container_ip"]): row["container_ip"] for row in csv.DictReader(handle)
        }
    published = {
        (pod_of_gpu[a.gpu_id], a.state.value, a.event_time.timestamp())
        for a in alerts
        if a.alert == "GpuIdle"
    }
    expected = idle_alerts_from_csv(5.0, 600.0)
    assert expected, "the trace has idle stretches"
    assert published == expected
    assert all(a.pod_name and a.pod_uid for a in alerts if a.alert == "GpuIdle")


def test_gpu_telemetry_stale_follows_the_gaps_of_the_csv() -> None:
    detector = AlertDetector(AlertRules(stale_after_s=300.0))
    alerts = [
        a
        for _, event in genai_duty.plan(genai_duty.read_samples(SAMPLES), cluster="genai")
        for a in detector.process(event)
    ]
    pod_of_node = {genai_duty.node_name(pod): pod for pod, _, _, _ in stale_alerts_from_csv(300.0)}
    published = {
        (pod_of_node[a.node or ""], a.state.value, a.event_time.timestamp(), a.since.timestamp())
        for a in alerts
        if a.alert == "GpuTelemetryStale"
    }
    expected = stale_alerts_from_csv(300.0)
    assert expected, "the trace has gaps longer than 5 minutes"
    assert published == expected


def test_node_not_ready_and_back_opens_and_resolves() -> None:
    detector = AlertDetector(AlertRules())
    node = example_events()[NODES]
    later = node.event_time + timedelta(minutes=5)
    assert detector.process(node) == []
    opened = detector.process(node.model_copy(update={"ready": False, "event_time": later}))
    assert [(a.alert, a.state) for a in opened] == [("NodeNotReady", AlertState.OPENED)]
    assert detector.process(node.model_copy(update={"ready": False, "event_time": later})) == []
    back = detector.process(node.model_copy(update={"event_time": later + timedelta(minutes=1)}))
    assert [(a.state, a.since) for a in back] == [(AlertState.RESOLVED, later)]


def test_a_pending_gpu_pod_alerts_with_reason_and_free_gpus_by_model() -> None:
    detector = AlertDetector(AlertRules(pending_for_s=300))
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    node = example_events(at=t0)[NODES]  # 8 MI300X, ready
    detector.process(node)
    running = example_events(at=t0)[PODS].model_copy(update={"gpu_amount": 6.0})
    detector.process(running)
    waiting = running.model_copy(
        update={
            "uid": "waiting",
            "name": "big-job",
            "node": None,
            "phase": "Pending",
            "gpu_amount": 4.0,
            "creation_time": t0,
            "unschedulable_reason": "Unschedulable",
            "unschedulable_message": "0/1 nodes are available: 1 Insufficient amd.com/gpu.",
        }
    )
    assert detector.process(waiting) == []
    opened = detector.process(node.model_copy(update={"event_time": t0 + timedelta(minutes=6)}))
    assert len(opened) == 1
    alert = opened[0]
    assert (alert.alert, alert.state, alert.event_time) == (
        "GpuPodPending",
        AlertState.OPENED,
        t0 + timedelta(minutes=5),
    )
    assert alert.labels["reason"] == "Unschedulable"
    assert alert.labels["free_gpus.AMD Instinct MI300X"] == "2"
    assert "Insufficient amd.com/gpu" in alert.message
    bound = waiting.model_copy(
        update={"node": node.node, "phase": "Running", "event_time": t0 + timedelta(minutes=9)}
    )
    resolved = detector.process(bound)
    assert [(a.state, a.event_time) for a in resolved] == [(AlertState.RESOLVED, t0 + timedelta(minutes=9))]


def test_a_gpu_missing_from_the_inventory_is_lost_until_it_returns() -> None:
    detector = AlertDetector(AlertRules())
    inventory = example_events()[DEVICE_INVENTORY]
    assert detector.process(inventory) == []
    shrunk = inventory.model_copy(update={"gpus": inventory.gpus[:1], "event_id": "2"})
    lost = detector.process(shrunk)
    assert [(a.alert, a.state, a.gpu_id) for a in lost] == [
        ("GpuLost", AlertState.OPENED, inventory.gpus[1].device_id)
    ]
    back = detector.process(inventory.model_copy(update={"event_id": "3"}))
    assert [(a.state, a.gpu_id) for a in back] == [(AlertState.RESOLVED, inventory.gpus[1].device_id)]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ("same", []),
        ("added", [(ChangeType.ADDED, DeviceKind.GPU, [])]),
        ("removed", [(ChangeType.DELETED, DeviceKind.GPU, [])]),
        ("changed", [(ChangeType.MODIFIED, DeviceKind.GPU, ["serial", "vbios_version"])]),
    ],
)
def test_device_changelog(change: str, expected: list) -> None:
    inventory = example_events()[DEVICE_INVENTORY]
    gpus = list(inventory.gpus)
    if change == "added":
        gpus.append(gpus[0].model_copy(update={"device_id": "new", "index": 2}))
    elif change == "removed":
        gpus = gpus[:1]
    elif change == "changed":
        gpus[0] = gpus[0].model_copy(update={"serial": "X1", "vbios_version": "113-NEW"})
    after = inventory.model_copy(update={"gpus": gpus, "event_id": "next"})
    changes = list(diff(inventory, after))
    assert [(c.change, c.device_kind, c.changed) for c in changes] == expected
    if change == "changed":
        assert changes[0].before["serial"] == inventory.gpus[0].serial
        assert changes[0].after["serial"] == "X1"


def test_first_inventory_lists_every_device_as_added() -> None:
    inventory = example_events()[DEVICE_INVENTORY]
    changes = list(diff(None, inventory))
    assert {(c.device_kind, c.change) for c in changes} == {
        (DeviceKind.GPU, ChangeType.ADDED),
        (DeviceKind.RDMA, ChangeType.ADDED),
    }
    assert len(changes) == len(inventory.gpus) + len(inventory.rdma_devices)
