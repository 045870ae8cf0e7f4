"""The ingest gateway with real gRPC and real brokers: who may publish, what is refused, when it acks."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from test_agent_publishing import read_topic

from gpulens.infra.broker import noida_argv
from gpulens.infra.launching import ServiceManager, ServiceSpec
from gpulens.platform import free_port
from gpulens.producers.agent import AgentSettings, build_agent
from gpulens.producers.agent.amd import AmdCollector
from gpulens.producers.gateway import (
    BATCH_ID_METADATA,
    Gateway,
    GatewayClientSettings,
    GatewayPublisher,
    GatewaySettings,
    running_gateway,
)
from gpulens.producers.publishing import PublishError
from gpulens.producers.watermarking import progress_mark
from gpulens.protos.gateway.v1 import ingest_pb2, ingest_pb2_grpc
from gpulens.schemas.kafka.settings import KafkaSettings
from gpulens.schemas.kafka.topic_admin import create_topics
from gpulens.schemas.model.models import PodEvent
from gpulens.schemas.model.topics import (
    CATALOG,
    DLQ,
    GPU_SAMPLES,
    NODES,
    PODS,
    WATERMARKS,
    TopicSpec,
    entity_key,
    record_key,
)
from gpulens.schemas.wire.codec import AvroCodec
from gpulens.testing.examples import example_events
from gpulens.testing.fake_amdsmi import FakeAmdSmi, mi300x
from gpulens.testing.gateway_support import TOKEN, event_ids, gateway_settings, private_topic, storage_event


def batch(codec: AvroCodec, topic: TopicSpec, batch_id: str, count: int) -> ingest_pb2.EventBatch:
    events = []
    for i in range(count):
        key, value = storage_event(codec, topic, f"{batch_id}-{i}", volume=f"vol-{i % 7}")
        events.append(ingest_pb2.Event(topic=topic.name, key=key, value=value))
    return ingest_pb2.EventBatch(batch_id=batch_id, events=events)


@pytest.fixture
def topic(platform, unique) -> TopicSpec:
    return private_topic(platform.kafka, f"test.gateway.{unique}")


@pytest.fixture
def gateway(platform, codec, topic) -> Iterator[Gateway]:
    with running_gateway(Gateway(gateway_settings(), platform.kafka, codec, topics=(topic, *CATALOG))) as gw:
        yield gw


@pytest.fixture
def stub(gateway) -> Iterator[ingest_pb2_grpc.IngestStub]:
    with grpc.insecure_channel(f"127.0.0.1:{gateway.port}") as channel:
        yield ingest_pb2_grpc.IngestStub(channel)


AUTH = (("authorization", f"Bearer {TOKEN}"),)


def rejected(gateway: Gateway, reason: str) -> float:
    value = gateway.metrics.registry.get_sample_value(
        "gpulens_gateway_rejected_batches_total", {"reason": reason}
    )
    return value or 0.0


@pytest.mark.parametrize("metadata", [(), (("authorization", "Bearer wrong"),), (("authorization", TOKEN),)])
def test_a_missing_or_wrong_token_is_refused_and_nothing_is_published(
    stub, gateway, platform, codec, topic, metadata
):
    with pytest.raises(grpc.RpcError) as refused:
        stub.Publish(iter([batch(codec, topic, "b1", 10)]), metadata=metadata, timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as refused_stream:
        list(stub.Stream(iter([batch(codec, topic, "b2", 10)]), metadata=metadata, timeout=10))
    assert refused_stream.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert rejected(gateway, "unauthenticated") == 2
    # The next call with the right token is the only thing on the topic.
    summary = stub.Publish(iter([batch(codec, topic, "b3", 10)]), metadata=AUTH, timeout=10)
    assert (summary.batches, summary.events) == (1, 10)
    assert set(event_ids(platform.kafka, codec, topic)) == {f"b3-{i}" for i in range(10)}


def _garbage(event: ingest_pb2.Event) -> None:
    event.value = event.value[:5] + b"\xff" * 3


def _wrong_key(event: ingest_pb2.Event) -> None:
    event.key = b"someone/else"


def _unknown_topic(event: ingest_pb2.Event) -> None:
    event.topic = "gpulens.nowhere.v1"


def _dead_letter_topic(event: ingest_pb2.Event) -> None:
    event.topic = DLQ.name


@pytest.mark.parametrize(
    ("spoil", "reason"),
    [
        (_garbage, "avro-decode-error"),
        (_wrong_key, "key-mismatch"),
        (_unknown_topic, "unknown-topic"),
        (_dead_letter_topic, "dead-letter-topic"),
    ],
)
def test_a_batch_with_one_bad_event_is_refused_whole_naming_the_event(
    stub, gateway, platform, codec, topic, spoil, reason
):
    good = batch(codec, topic, "good", 20)
    bad = batch(codec, topic, "bad", 20)
    spoil(bad.events[13])
    acks: list[str] = []
    for call in (stub.Publish, stub.Stream):
        with pytest.raises(grpc.RpcError) as refused:
            answer = call(iter([good, bad]), metadata=AUTH, timeout=10)
            if call is stub.Stream:
                acks.extend(ack.batch_id for ack in answer)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "'bad', event 13: " + reason in refused.value.details()
        assert dict(refused.value.trailing_metadata())[BATCH_ID_METADATA] == "bad"
    assert acks == ["good"]  # a stream acks the batches before the bad one, then ends
    assert rejected(gateway, reason) == 2
    published = event_ids(platform.kafka, codec, topic)
    assert set(published) == {f"good-{i}" for i in range(20)}  # the good batch, once though sent twice
    assert set(published.values()) == {1}


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[tuple[KafkaSettings, ServiceManager, ServiceSpec]]:
    """A noida broker of this test's own, which the test stops and starts again."""
    port = free_port()
    spec = ServiceSpec(
        "kafka", noida_argv("127.0.0.1", port, tmp_path / "broker" / "data"), "127.0.0.1", port
    )
    services = ServiceManager(tmp_path / "broker")
    services.start(spec)
    kafka = KafkaSettings(
        bootstrap_servers=f"127.0.0.1:{port}",
        extra={"reconnect.backoff.ms": "50", "reconnect.backoff.max.ms": "200"},
    )
    try:
        yield kafka, services, spec
    finally:
        services.stop("kafka")


def resend_until_acked(
    stub: ingest_pb2_grpc.IngestStub, sent: ingest_pb2.EventBatch
) -> list[ingest_pb2.BatchAck]:
    """What a client does: send the same batch again while the answer is UNAVAILABLE (30 s at most)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return list(stub.Stream(iter([sent]), metadata=AUTH, timeout=30))
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise


def test_a_batch_is_acked_only_after_the_broker_took_it_and_a_resend_publishes_it_once(own_broker, codec):
    kafka, services, spec = own_broker
    topic = private_topic(kafka, "test.gateway.outage")
    settings = gateway_settings(ack_timeout_s=1.0)
    with (
        running_gateway(Gateway(settings, kafka, codec, topics=[topic])) as gateway,
        grpc.insecure_channel(f"127.0.0.1:{gateway.port}") as channel,
    ):
        stub = ingest_pb2_grpc.IngestStub(channel)
        assert stub.Publish(iter([batch(codec, topic, "before", 50)]), metadata=AUTH, timeout=10).events == 50

        services.stop("kafka")
        during = batch(codec, topic, "during", 50)
        for call in (stub.Publish, stub.Stream):
            with pytest.raises(grpc.RpcError) as unavailable:
                answer = call(iter([during]), metadata=AUTH, timeout=10)
                assert list(answer) == [], "no ack while the broker is away"
            assert unavailable.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "'during'" in unavailable.value.details()

        services.start(spec)
        acks = resend_until_acked(stub, during)
        assert [(a.batch_id, a.events) for a in acks] == [("during", 50)]
        published_metric = gateway.metrics.registry.get_sample_value("gpulens_gateway_events_published_total")

    published = event_ids(kafka, codec, topic)
    assert set(published) == {f"before-{i}" for i in range(50)} | {f"during-{i}" for i in range(50)}
    assert set(published.values()) == {1}
    assert published_metric == 100


def test_the_agent_configured_for_the_gateway_delivers_its_samples_through_it(
    gateway, platform, codec, unique, tmp_path
):
    settings = AgentSettings(
        node=f"gw-node-{unique}",
        spool_dir=tmp_path / "spool",
        transport="gateway",
        gateway=GatewayClientSettings(address=f"127.0.0.1:{gateway.port}", token=TOKEN),
    )
    agent = build_agent(
        settings,
        cluster="gateway-test",
        kafka=KafkaSettings(bootstrap_servers="127.0.0.1:1"),  # never used: the gateway publishes
        codec=codec,
        collectors=[AmdCollector(FakeAmdSmi([mi300x(0), mi300x(1)]))],
    )
    agent.start()
    agent.tick()
    agent.close()

    assert agent.sender.in_flight == 0 and agent.sender.spooled == 0
    key = entity_key("gateway-test", settings.node)
    [samples] = [codec.decode(GPU_SAMPLES, v) for v in read_topic(platform.kafka, GPU_SAMPLES, key, 1)]
    assert [s.index for s in samples.samples] == [0, 1]
    # stopping, the agent vouched for its round once the gateway acked it: a message of its own
    source = settings.own_source
    [mark] = [
        codec.decode(WATERMARKS, v)
        for v in read_topic(platform.kafka, WATERMARKS, entity_key("gateway-test", source), 1)
    ]
    assert (mark.source, mark.event_time, mark.final) == (source, samples.event_time, False)
    received = gateway.metrics.registry.get_sample_value("gpulens_gateway_events_received_total")
    assert received == 5  # the sample batch, the inventory and each GPU's first health, then the watermark


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate and key for localhost / 127.0.0.1, made by openssl."""
    cert, key = directory / "gateway.pem", directory / "gateway.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl makes the test certificate")
def test_with_tls_an_agent_trusting_the_ca_is_served_and_a_plaintext_one_is_not(
    platform, codec, unique, tmp_path
) -> None:
    topic = private_topic(platform.kafka, f"test.gateway.tls.{unique}")
    cert, key = self_signed(tmp_path)
    gateway = Gateway(gateway_settings(tls_cert=cert, tls_key=key), platform.kafka, codec, topics=[topic])
    with running_gateway(gateway):
        address = f"localhost:{gateway.port}"
        trusted = GatewayPublisher(GatewayClientSettings(address=address, token=TOKEN, tls_ca=cert), codec)
        try:
            trusted.produce(topic.name, *storage_event(codec, topic, "over-tls"))
            trusted.flush(30)
        finally:
            trusted.close()
        plaintext = GatewayPublisher(
            GatewayClientSettings(address=address, token=TOKEN, retry_backoff_s=0.1),
            codec,
            delivery_timeout_s=2,
        )
        try:
            plaintext.produce(topic.name, *storage_event(codec, topic, "in-clear"))
            with pytest.raises(PublishError):
                plaintext.flush(10)
        finally:
            plaintext.close()
    assert event_ids(platform.kafka, codec, topic) == {"over-tls": 1}


def test_an_event_breaking_the_models_rules_is_refused_naming_the_field(platform, codec, unique):
    pods = TopicSpec(f"test.gateway.pods.{unique}", PodEvent, "uid", 2)
    create_topics(platform.kafka, [pods])
    good = example_events("gateway-rules")[PODS]
    negative = good.model_copy(update={"event_id": "negative", "uid": "pod-negative"})
    events = [
        ingest_pb2.Event(topic=pods.name, key=record_key(pods, good), value=codec.encode(pods, good)),
        ingest_pb2.Event(
            topic=pods.name,
            key=record_key(pods, negative),
            value=codec.encode_dict(pods, {**negative.model_dump(), "gpu_amount": -2.0}),  # no model check
        ),
    ]
    with (
        running_gateway(Gateway(gateway_settings(), platform.kafka, codec, topics=[pods])) as gateway,
        grpc.insecure_channel(f"127.0.0.1:{gateway.port}") as channel,
    ):
        stub = ingest_pb2_grpc.IngestStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Publish(
                iter([ingest_pb2.EventBatch(batch_id="rules", events=events)]), metadata=AUTH, timeout=10
            )
        assert rejected(gateway, "invalid-record") == 1
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "event 1: invalid-record: " in refused.value.details()
    assert "PodEvent.gpu_amount: Input should be greater than or equal to 0" in refused.value.details()
    assert "(value: -2.0)" in refused.value.details()
    assert event_ids(platform.kafka, codec, pods) == {}  # nothing of the batch was published


def test_a_batch_id_sent_again_with_other_events_is_refused_and_a_true_resend_still_acked(
    stub, gateway, platform, codec, topic
):
    first = batch(codec, topic, "reused", 5)
    other = batch(codec, topic, "other", 5)
    other.batch_id = "reused"
    assert stub.Publish(iter([first]), metadata=AUTH, timeout=10).events == 5
    for call in (stub.Publish, stub.Stream):
        with pytest.raises(grpc.RpcError) as refused:
            answer = call(iter([other]), metadata=AUTH, timeout=10)
            if call is stub.Stream:
                list(answer)
        assert refused.value.code() == grpc.StatusCode.ALREADY_EXISTS
        assert "'reused' was already sent with other events" in refused.value.details()
        assert dict(refused.value.trailing_metadata())[BATCH_ID_METADATA] == "reused"
    resent = stub.Publish(iter([first]), metadata=AUTH, timeout=10)
    assert (resent.events, resent.duplicates) == (5, 1)
    assert rejected(gateway, "batch-id-reused") == 2
    published = event_ids(platform.kafka, codec, topic)
    assert published == {f"reused-{i}": 1 for i in range(5)}  # the first events, once


def test_a_message_that_is_not_an_event_batch_is_invalid_argument(gateway):
    with grpc.insecure_channel(f"127.0.0.1:{gateway.port}") as channel:
        for method in ("Publish", "Stream"):
            call = (channel.stream_unary if method == "Publish" else channel.stream_stream)(
                f"/gpulens.gateway.v1.Ingest/{method}",
                request_serializer=bytes,
                response_deserializer=ingest_pb2.PublishSummary.FromString,
            )
            with pytest.raises(grpc.RpcError) as refused:
                answer = call(iter([b"\x0a\x05ab"]), metadata=AUTH, timeout=10)
                if method == "Stream":
                    list(answer)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, method
            assert "undecodable-batch: the message is not an EventBatch" in refused.value.details()
    assert rejected(gateway, "undecodable-batch") == 2


def test_the_metrics_port_binds_loopback_unless_configured():
    assert GatewaySettings().metrics_host == "127.0.0.1"


def test_a_watermark_is_published_only_after_the_rest_of_its_batch_is_acknowledged(
    stub, gateway, platform, codec, unique
):
    """Sent first in its batch, the watermark still reaches the broker last: the gateway produces
    it once every other record of the batch is acknowledged (produce times read back)."""
    cluster = f"gw-marks-{unique}"
    events = example_events(cluster, "node-agent/n1")
    mark = progress_mark(cluster, "node-agent/n1", events[GPU_SAMPLES].event_time)
    others = [events[spec] for spec in (GPU_SAMPLES, PODS, NODES)]
    batch = ingest_pb2.EventBatch(
        batch_id=f"marks-{unique}",
        events=[
            ingest_pb2.Event(topic=spec.name, key=record_key(spec, event), value=codec.encode(spec, event))
            for spec, event in ((WATERMARKS, mark), *((s, events[s]) for s in (GPU_SAMPLES, PODS, NODES)))
        ],
    )
    summary = stub.Publish(iter([batch]), metadata=AUTH, timeout=30)
    assert summary.events == 4

    def produced(spec: TopicSpec, event) -> int:
        consumer = Consumer(platform.kafka.librdkafka(**{"group.id": f"t-{unique}-{spec.name}"}))
        try:
            partitions = consumer.list_topics(spec.name, timeout=10).topics[spec.name].partitions
            consumer.assign([TopicPartition(spec.name, p, OFFSET_BEGINNING) for p in partitions])
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                message = consumer.poll(0.2)
                if (
                    message is not None
                    and message.error() is None
                    and message.key() == record_key(spec, event)
                ) and codec.decode(spec, message.value()).event_id == event.event_id:
                    return message.timestamp()[1]
        finally:
            consumer.close()
        raise AssertionError(f"{event.event_id} not found on {spec.name}")

    rest = [produced(spec, event) for spec, event in zip((GPU_SAMPLES, PODS, NODES), others, strict=True)]
    assert produced(WATERMARKS, mark) > max(rest)
