"""The agent against real brokers: one batch per interval, inventory on change, the spool."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from gpulens.infra.broker import noida_argv
from gpulens.infra.launching import ServiceManager, ServiceSpec
from gpulens.platform import free_port
from gpulens.producers.agent import AgentMetrics, AgentSettings, NodeAgent, build_agent
from gpulens.producers.agent.amd import AmdCollector
from gpulens.producers.agent.collecting import BaseCollector
from gpulens.producers.agent.podresources import PodResourcesCollector
from gpulens.producers.agent.spooling import Spool
from gpulens.schemas.kafka.settings import KafkaSettings
from gpulens.schemas.kafka.topic_admin import create_topics
from gpulens.schemas.model.topics import (
    CONTAINERS,
    DEVICE_INVENTORY,
    GPU_HEALTH,
    GPU_SAMPLES,
    TopicSpec,
    entity_key,
)
from gpulens.schemas.wire.codec import AvroCodec
from gpulens.testing.fake_amdsmi import FakeAmdSmi, mi300x
from gpulens.testing.fake_kubelet import Kubelet, serving

T0 = datetime(2026, 11, 3, 12, 0, tzinfo=UTC)


class Clock:
    """Event time the test moves by hand: each tick is one interval later."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def wait_for(condition: Callable[[], bool], *, pump: Callable[[], None], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        pump()
        time.sleep(0.02)


def read_topic(kafka: KafkaSettings, topic: TopicSpec, key: bytes, count: int) -> list[bytes]:
    """The values of ``key`` on ``topic``, in offset order, once ``count`` of them are there."""
    consumer = Consumer(
        kafka.librdkafka(**{"group.id": f"agent-test-{time.monotonic_ns()}", "auto.offset.reset": "earliest"})
    )
    consumer.subscribe([topic.name])
    values: list[bytes] = []
    deadline = time.monotonic() + 30
    try:
        while len(values) < count and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None and message.key() == key:
                values.append(message.value())
        time.sleep(0.2)  # and nothing more arrives
        while (message := consumer.poll(0.2)) is not None:
            if message.error() is None and message.key() == key:
                values.append(message.value())
    finally:
        consumer.close()
    return values


def make_agent(
    settings: AgentSettings, kafka: KafkaSettings, codec: AvroCodec, collectors: list[BaseCollector], **kw
) -> NodeAgent:
    return build_agent(settings, cluster="agent-test", kafka=kafka, codec=codec, collectors=collectors, **kw)


def test_one_batch_per_interval_with_every_gpu_and_inventory_only_on_change(
    platform, codec, unique, tmp_path
):
    library = FakeAmdSmi([mi300x(i) for i in range(8)])
    settings = AgentSettings(node=f"node-{unique}", spool_dir=tmp_path / "spool", inventory_interval_s=600)
    clock = Clock()
    agent = make_agent(settings, platform.kafka, codec, [AmdCollector(library)], clock=clock)
    agent.start()
    times = [T0 + timedelta(seconds=5 * i) for i in range(5)] + [T0 + timedelta(seconds=620)]
    for i, at in enumerate(times):
        clock.now = at
        if i == 3:
            library.gpus[5]["driver"] = {**library.gpus[5]["driver"], "driver_version": "6.10.5"}
        agent.tick()
    agent.close()

    key = entity_key("agent-test", settings.node)
    batches = [codec.decode(GPU_SAMPLES, v) for v in read_topic(platform.kafka, GPU_SAMPLES, key, 6)]
    assert [b.event_time for b in batches] == times
    assert all(len(b.samples) == 8 for b in batches)
    assert [s.index for s in batches[0].samples] == list(range(8))
    assert batches[0].samples[3].memory_total_bytes == 196592 * 1024 * 1024
    assert len({b.event_id for b in batches}) == 6

    inventories = [
        codec.decode(DEVICE_INVENTORY, v) for v in read_topic(platform.kafka, DEVICE_INVENTORY, key, 3)
    ]
    # First sight, the driver update at tick 3, and the periodic republish after 600 s.
    assert [i.event_time for i in inventories] == [times[0], times[3], times[5]]
    assert [i.gpus[5].driver_version for i in inventories] == ["6.8.5", "6.10.5", "6.10.5"]
    assert all(len(i.gpus) == 8 for i in inventories)


@pytest.fixture
def dead_kafka() -> KafkaSettings:
    """A broker address where nothing listens (yet); reconnects fast once something does."""
    return KafkaSettings(
        bootstrap_servers=f"127.0.0.1:{free_port()}",
        extra={"reconnect.backoff.ms": "50", "reconnect.backoff.max.ms": "200"},
    )


@dataclass
class Outage:
    """An agent (two MI300X, a kubelet) publishing to ``dead_kafka`` with a 1 s delivery timeout."""

    agent: NodeAgent
    kubelet: Kubelet
    metrics: AgentMetrics
    clock: Clock

    def run(self, rounds: int) -> None:
        """``rounds`` ticks while the broker is away; the pod on GPU 0 changes at rounds 2 and 4."""
        sender = self.agent.sender
        for i in range(rounds):
            self.clock.now = T0 + timedelta(seconds=5 * i)
            if i == 0:
                self.kubelet.pods = {("ml", "train-0"): {"amd.com/gpu": ["0000:0c:00.0"]}}
            elif i == 2:
                self.kubelet.pods = {("ml", "train-1"): {"amd.com/gpu": ["0000:0c:00.0"]}}
            elif i == 4:
                self.kubelet.pods[("ml", "train-1")]["amd.com/gpu"].append("0000:1c:00.0")
            self.agent.tick()
            if i == 0:  # the first round went straight to the producer: wait until it gave up
                wait_for(lambda: sender.spooled >= 3, pump=sender.pump)

    def dropped(self) -> float | None:
        return self.metrics.registry.get_sample_value("gpulens_agent_dropped_samples_total")


@pytest.fixture
def outage(tmp_path: Path, codec: AvroCodec, dead_kafka: KafkaSettings) -> Iterator[Callable[..., Outage]]:
    made: list[Outage] = []
    with serving(tmp_path / "kubelet.sock") as kubelet:

        def make(**overrides) -> Outage:
            settings = AgentSettings(
                node="outage-node",
                spool_dir=tmp_path / "spool",
                delivery_timeout_s=1.0,
                pod_resources_socket=tmp_path / "kubelet.sock",
                **overrides,
            )
            collectors = [
                AmdCollector(FakeAmdSmi([mi300x(0), mi300x(1)])),
                PodResourcesCollector(tmp_path / "kubelet.sock"),
            ]
            clock, metrics = Clock(), AgentMetrics()
            agent = make_agent(settings, dead_kafka, codec, collectors, clock=clock, metrics=metrics)
            agent.start()
            made.append(Outage(agent, kubelet, metrics, clock))
            return made[-1]

        yield make
        for case in made:
            case.agent.close(timeout_s=0)


def test_records_made_while_kafka_is_away_arrive_in_order_once_it_is_there(
    outage, dead_kafka, codec, tmp_path
):
    case = outage()
    agent = case.agent
    case.run(6)
    # batches, inventory, each GPU's first health, ADDED / DELETED+ADDED / MODIFIED
    assert agent.sender.spooled == 6 + 1 + 2 + 4

    port = int(dead_kafka.bootstrap_servers.rpartition(":")[2])
    services = ServiceManager(tmp_path / "broker")
    services.start(
        ServiceSpec("kafka", noida_argv("127.0.0.1", port, tmp_path / "broker" / "data"), "127.0.0.1", port)
    )
    try:
        create_topics(dead_kafka)
        wait_for(lambda: agent.sender.spooled == 0 and agent.sender.in_flight == 0, pump=agent.sender.pump)
        key = entity_key("agent-test", "outage-node")
        batches = [codec.decode(GPU_SAMPLES, v) for v in read_topic(dead_kafka, GPU_SAMPLES, key, 6)]
        inventories = read_topic(dead_kafka, DEVICE_INVENTORY, key, 1)
        containers = [codec.decode(CONTAINERS, v) for v in read_topic(dead_kafka, CONTAINERS, key, 4)]
        health = [codec.decode(GPU_HEALTH, v) for v in read_topic(dead_kafka, GPU_HEALTH, key, 2)]
    finally:
        agent.close(timeout_s=0)
        services.stop("kafka")

    assert [b.event_time for b in batches] == [T0 + timedelta(seconds=5 * i) for i in range(6)]
    assert len(inventories) == 1
    assert [(h.index, h.healthy, h.event_time) for h in health] == [(0, True, T0), (1, True, T0)]
    assert [(c.type.value, c.pod_name, len(c.devices)) for c in containers] == [
        ("ADDED", "train-0", 1),
        ("DELETED", "train-0", 0),
        ("ADDED", "train-1", 1),
        ("MODIFIED", "train-1", 2),
    ]
    assert case.dropped() == 0
    errors = case.metrics.registry.get_sample_value
    assert errors("gpulens_agent_publish_errors_total", {"topic": GPU_SAMPLES.name}) >= 1


def test_a_full_spool_drops_the_oldest_samples_and_never_inventory_or_containers(outage, codec, tmp_path):
    case = outage(spool_max_bytes=4000)
    case.run(20)
    case.agent.close(timeout_s=0)  # what is still in flight goes to the spool too

    spool = Spool(tmp_path / "spool", max_bytes=4000)
    try:
        kept = spool.head(1000)
    finally:
        spool.close()
    by_topic = {
        name: [r for r in kept if r.topic == name]
        for name in (GPU_SAMPLES.name, DEVICE_INVENTORY.name, CONTAINERS.name)
    }
    assert len(by_topic[DEVICE_INVENTORY.name]) == 1
    assert len(by_topic[CONTAINERS.name]) == 4
    samples = [codec.decode(GPU_SAMPLES, r.value) for r in by_topic[GPU_SAMPLES.name]]
    assert 0 < len(samples) < 20 and case.dropped() == 20 - len(samples)
    # The newest survive: the kept batches are the last rounds, in order.
    assert [s.event_time for s in samples] == [
        T0 + timedelta(seconds=5 * i) for i in range(20 - len(samples), 20)
    ]
