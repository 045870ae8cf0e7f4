"""Many events from several agents through one gateway: each arrives on Kafka exactly once."""

from __future__ import annotations

import threading

from gpulens.producers.gateway import Gateway, GatewayClientSettings, GatewayPublisher, running_gateway
from gpulens.schemas.model.models import StorageEvent
from gpulens.schemas.model.topics import TopicSpec, record_key
from gpulens.schemas.wire.codec import AvroCodec
from gpulens.testing.gateway_support import TOKEN, event_ids, gateway_settings, private_topic, storage_values

AGENTS = 4
EVENTS_PER_AGENT = 50_000  # 1,000,000 in all took 130 s here: bench/gateway_throughput.py runs that


def send(address: str, codec: AvroCodec, topic: TopicSpec, name: str, failures: list[BaseException]) -> None:
    """One agent: its own connection and stream, its events in batches of 500, then flush."""
    publisher = GatewayPublisher(GatewayClientSettings(address=address, token=TOKEN), codec)
    values = storage_values(f"vol-{name}")
    key = record_key(topic, StorageEvent.model_construct(**values))
    try:
        for i in range(EVENTS_PER_AGENT):
            publisher.produce(
                topic.name, key, codec.encode_dict(topic, {**values, "event_id": f"{name}-{i}"})
            )
        publisher.flush(120)
    except BaseException as err:  # handed to the test's thread
        failures.append(err)
    finally:
        publisher.close()


def test_events_streamed_by_four_agents_arrive_exactly_once(platform, codec, unique):
    topic = private_topic(platform.kafka, f"test.gateway.bulk.{unique}")
    gateway = Gateway(gateway_settings(), platform.kafka, codec, topics=[topic])
    failures: list[BaseException] = []
    with running_gateway(gateway):
        address = f"127.0.0.1:{gateway.port}"
        agents = [
            threading.Thread(target=send, args=(address, codec, topic, f"agent{n}", failures))
            for n in range(AGENTS)
        ]
        for thread in agents:
            thread.start()
        for thread in agents:
            thread.join()
    assert failures == []

    published = event_ids(platform.kafka, codec, topic)
    assert len(published) == AGENTS * EVENTS_PER_AGENT
    assert set(published.values()) == {1}
    assert set(published) == {f"agent{n}-{i}" for n in range(AGENTS) for i in range(EVENTS_PER_AGENT)}
