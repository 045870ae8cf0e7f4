"""GpuUnhealthy, GpuLost with the health history, GpuTelemetryStale: synthetic event streams whose
open and resolve times are worked out by hand in each test's comments."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpulens.pipeline.alerting import AlertDetector, AlertRules
from gpulens.schemas.model.models import (
    Alert,
    ChangeType,
    Event,
    GpuHealthEvent,
    GpuSample,
    GpuSampleBatch,
    PodEvent,
)
from gpulens.schemas.model.topics import CONTAINERS, DEVICE_INVENTORY, NODES, PODS
from gpulens.testing.examples import NODE, example_events

T0 = datetime(2026, 11, 3, 12, 0, tzinfo=UTC)
CLUSTER = "health"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def health(seconds: float, gpu: str, conditions: list[str], *, node: str = NODE) -> GpuHealthEvent:
    return GpuHealthEvent(
        event_id=f"h-{gpu}-{seconds}",
        cluster=CLUSTER,
        event_time=at(seconds),
        source="node-agent",
        node=node,
        device_id=gpu,
        index=0,
        vendor="NVIDIA",
        healthy=not conditions,
        conditions=conditions,
        cause="xid" if any(c.startswith("xid-") for c in conditions) else "counters",
        xid=79 if "xid-79" in conditions else None,
        message=f"{gpu} at {seconds:g} s: {', '.join(conditions) or 'healthy'}",
    )


def samples(seconds: float, node: str) -> GpuSampleBatch:
    return GpuSampleBatch(
        event_id=f"s-{node}-{seconds}",
        cluster=CLUSTER,
        event_time=at(seconds),
        source="node-agent",
        node=node,
        samples=[GpuSample(device_id=f"{node}-gpu0", index=0, utilization_pct=50.0)],
    )


def pod(seconds: float, uid: str, node: str, *, deleted: bool = False) -> PodEvent:
    return example_events(cluster=CLUSTER)[PODS].model_copy(
        update={
            "event_id": f"p-{uid}-{seconds}",
            "event_time": at(seconds),
            "uid": uid,
            "node": node,
            "gpu_amount": 1.0,
            "type": ChangeType.DELETED if deleted else ChangeType.MODIFIED,
        }
    )


def run(detector: AlertDetector, events: list[Event]) -> list[Alert]:
    return [alert for event in events for alert in detector.process(event)]


def summary(alerts: list[Alert], kind: str) -> list[tuple]:
    """(entity, state, event time, since) in seconds after T0, of the ``kind`` alerts."""
    return [
        (a.entity, a.state.value, (a.event_time - T0).total_seconds(), (a.since - T0).total_seconds())
        for a in alerts
        if a.alert == kind
    ]


def test_gpu_unhealthy_opens_on_the_first_unhealthy_event_and_resolves_on_the_first_healthy_one() -> None:
    # gpu-a: healthy at 0; XID 79 at 10 (opens, since 10); still sick at 20 with more (stays open);
    # healthy at 70 (resolves at 70, since 10); uncorrectable ECC at 100 (opens again, since 100).
    # gpu-b: only ever healthy: never alerts.
    events: list[Event] = [
        health(0, "gpu-a", []),
        health(0, "gpu-b", []),
        health(10, "gpu-a", ["xid-79"]),
        health(20, "gpu-a", ["xid-79", "ecc-uncorrectable"]),
        health(30, "gpu-b", []),
        health(70, "gpu-a", []),
        health(100, "gpu-a", ["ecc-uncorrectable"]),
    ]
    alerts = run(AlertDetector(AlertRules()), events)
    assert summary(alerts, "GpuUnhealthy") == [
        ("gpu-a", "OPENED", 10.0, 10.0),
        ("gpu-a", "RESOLVED", 70.0, 10.0),
        ("gpu-a", "OPENED", 100.0, 100.0),
    ]
    opened = alerts[0]
    assert (opened.node, opened.gpu_id, opened.labels["conditions"], opened.labels["xid"]) == (
        NODE,
        "gpu-a",
        "xid-79",
        "79",
    )
    assert opened.message == "gpu-a at 10 s: xid-79"
    assert len({a.event_id for a in alerts}) == 3


def test_gpu_unhealthy_names_the_pod_holding_the_gpu() -> None:
    examples = example_events(cluster=CLUSTER, at=T0)
    inventory = examples[DEVICE_INVENTORY]
    gpu = inventory.gpus[0].device_id  # the example's container holds both GPUs (by PCI address)
    detector = AlertDetector(AlertRules())
    run(detector, [examples[NODES], inventory, examples[CONTAINERS], examples[PODS]])
    [opened] = detector.process(health(1, gpu, ["xid-48"]))
    pod_ = examples[PODS]
    assert (opened.pod_namespace, opened.pod_name) == (pod_.namespace, pod_.name)


def test_gpu_lost_carries_the_last_health_event_of_the_gpu() -> None:
    # Inventory with both GPUs at 0; GPU 1 reports XID 79 (fallen off the bus) at 40; the inventory
    # at 60 lacks it: GpuLost opens at 60 and says what the GPU last reported, at 40.
    inventory = example_events(cluster=CLUSTER, at=T0)[DEVICE_INVENTORY]
    lost = inventory.gpus[1].device_id
    without = inventory.model_copy(
        update={"event_id": "inv-60", "event_time": at(60), "gpus": inventory.gpus[:1]}
    )
    alerts = run(AlertDetector(AlertRules()), [inventory, health(40, lost, ["xid-79"]), without])
    assert summary(alerts, "GpuLost") == [(lost, "OPENED", 60.0, 60.0)]
    [gone] = [a for a in alerts if a.alert == "GpuLost"]
    assert gone.message == (
        f"GPU {lost} vanished from the inventory of {NODE}; last health event at "
        f"{at(40).isoformat()}: {lost} at 40 s: xid-79"
    )
    assert gone.labels == {"last_health_time": at(40).isoformat(), "last_health_conditions": "xid-79"}


def stale_story() -> list[Event]:
    """Node a samples every 5 s until 100 and holds a GPU pod from 1; node b samples every 5 s from
    0 to 600 (it moves event time); node c holds a pod but never sampled."""
    events: list[Event] = [pod(1, "pod-1", "node-a"), pod(1, "pod-c", "node-c")]
    events += [samples(s, "node-a") for s in range(0, 101, 5)]
    events += [samples(s, "node-b") for s in range(0, 601, 5)]
    events += [samples(300, "node-a")]  # a comes back once at 300
    events += [pod(350, "pod-1", "node-a", deleted=True), pod(500, "pod-2", "node-a")]
    events += [pod(550, "pod-2", "node-a", deleted=True)]
    # in time order, pods before samples at one instant (the worker's input order)
    return sorted(events, key=lambda e: (e.event_time, not isinstance(e, PodEvent)))


# With stale_after 120 s:
# - a's last sample before the gap is at 100: silent more than 120 s after 220, its pod running:
#   opens at 220 (since 100), emitted with the first event after 220;
# - a samples at 300: resolves at 300 (since 100);
# - pod-1 leaves at 350 and a is silent from 300: at 420 the silence is longer than 120 s but
#   no pod holds GPUs there: nothing;
# - pod-2 starts holding at 500, a silent since 300 (200 s): opens at 500 (since 300);
# - pod-2 leaves at 550: resolves at 550 (since 300).
# - b never holds pods, c never sampled: neither alerts.
STALE_EXPECTED = [
    ("node-a", "OPENED", 220.0, 100.0),
    ("node-a", "RESOLVED", 300.0, 100.0),
    ("node-a", "OPENED", 500.0, 300.0),
    ("node-a", "RESOLVED", 550.0, 300.0),
]


def test_gpu_telemetry_stale_opens_after_the_silence_and_resolves_when_samples_or_pods_end() -> None:
    alerts = run(AlertDetector(AlertRules(stale_after_s=120)), stale_story())
    assert summary(alerts, "GpuTelemetryStale") == STALE_EXPECTED
    assert [a.message for a in alerts if a.alert == "GpuTelemetryStale"] == [
        "no GPU samples from node-a for 0:02:00 while its pods hold GPUs",
        "GPU telemetry of node-a after 0:03:20 silent: samples are back",
        "no GPU samples from node-a for 0:03:20 while its pods hold GPUs",
        "GPU telemetry of node-a after 0:04:10 silent: no GPU pods left",
    ]


def test_gpu_telemetry_stale_survives_a_restart_from_the_checkpoint() -> None:
    events = stale_story()
    cut = next(n for n, e in enumerate(events) if e.event_time >= at(150))
    first = AlertDetector(AlertRules(stale_after_s=120))
    before = run(first, events[:cut])
    restored = AlertDetector(AlertRules(stale_after_s=120))
    for key in first.live():
        restored.load(key, first.dump(key))
    after = run(restored, events[cut:])
    assert summary(before + after, "GpuTelemetryStale") == STALE_EXPECTED
