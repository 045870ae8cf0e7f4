"""The embedded schema registry, driven by confluent-kafka's own client and serdes."""

from __future__ import annotations

import copy
import io
import json
import struct
import subprocess
import sys
import urllib.request
from dataclasses import replace

import fastavro
import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from gpulens.platform import REGISTRY, service_specs
from gpulens.schemas.kafka.topic_admin import create_topics
from gpulens.schemas.model.avro_schema import committed
from gpulens.schemas.model.exceptions import IncompatibleSchemaError
from gpulens.schemas.model.models import PodEvent
from gpulens.schemas.model.topics import PODS, TopicSpec
from gpulens.schemas.wire.codec import AvroCodec, register, registry_client
from gpulens.testing.examples import example_events


def _topic(platform, name: str, record=PodEvent) -> TopicSpec:
    spec = TopicSpec(name, record, "uid", 1)
    create_topics(platform.kafka, [spec])
    return spec


def _read_one(platform, topic: str, group: str) -> bytes:
    consumer = Consumer(platform.kafka.librdkafka(**{"group.id": group, "auto.offset.reset": "earliest"}))
    consumer.subscribe([topic])
    try:
        for _ in range(60):
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                return message.value()
        raise AssertionError(f"nothing arrived on {topic}")
    finally:
        consumer.close()


def _schema(text: str) -> dict:
    return json.loads(text)


@pytest.mark.parametrize("example", list(example_events()), ids=lambda t: t.record.__name__)
def test_every_schema_round_trips_with_confluent_serdes(platform, codec, unique, example) -> None:
    event = example_events()[example]
    topic = _topic(platform, f"t-{unique}", example.record)
    client = SchemaRegistryClient({"url": platform.registry.url})
    serializer = AvroSerializer(client, committed(example.record), lambda obj, _ctx: obj.model_dump())
    deserializer = AvroDeserializer(client)
    context = SerializationContext(topic.name, MessageField.VALUE)

    producer = Producer(platform.kafka.librdkafka())
    producer.produce(topic.name, value=serializer(event, context))
    producer.flush(30)
    wire = _read_one(platform, topic.name, f"g-{unique}")

    assert example.record.model_validate(deserializer(wire, context)) == event
    # Our codec is wire-compatible both ways: same id, same bytes.
    assert codec.decode(topic, wire) == event
    assert codec.encode(topic, event) == wire


def test_a_second_process_resolves_the_same_ids(platform, codec) -> None:
    schema_id = codec.schema_id(PODS)
    script = f"""
import json
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
client = SchemaRegistryClient({{"url": {platform.registry.url!r}}})
text = client.get_schema({schema_id}).schema_str
again = client.register_schema({PODS.subject!r}, Schema(text, "AVRO"))
print(json.dumps({{"text": text, "again": again}}))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    seen = json.loads(out.stdout)
    assert _schema(seen["text"]) == _schema(committed(PodEvent))
    assert seen["again"] == schema_id


def test_ids_survive_a_registry_restart(platform, services, config_file, unique) -> None:
    client = registry_client(platform.registry.url)
    text = json.dumps({"type": "record", "name": f"R{unique}", "fields": [{"name": "a", "type": "long"}]})
    schema_id = register(client, f"restart-{unique}", text)

    services.stop(REGISTRY)
    services.start(service_specs(platform, config_file)[REGISTRY], timeout=60)

    fresh = registry_client(platform.registry.url)
    assert _schema(fresh.schema_text(schema_id)) == _schema(text)
    assert register(fresh, f"restart-{unique}", text) == schema_id
    other = json.dumps({"type": "record", "name": f"S{unique}", "fields": [{"name": "b", "type": "long"}]})
    assert register(fresh, f"restart2-{unique}", other) > schema_id


def test_the_same_schema_under_two_subjects_has_one_id(platform, unique) -> None:
    client = registry_client(platform.registry.url)
    text = committed(PodEvent)
    assert register(client, f"a-{unique}", text) == register(client, f"b-{unique}", text)


def _v2_with(field: dict) -> str:
    schema = _schema(committed(PodEvent))
    evolved = copy.deepcopy(schema)
    evolved["fields"].append(field)
    return json.dumps(evolved)


def test_a_backward_compatible_v2_is_accepted_and_v1_readers_decode_it(platform, codec, unique) -> None:
    topic = _topic(platform, f"evolve-{unique}")
    v1_id = codec.schema_id(topic)
    v2_text = _v2_with({"name": "priority_class", "type": ["null", "string"], "default": None, "doc": "x"})
    v2_id = register(registry_client(platform.registry.url), topic.subject, v2_text)
    assert v2_id != v1_id

    event = example_events()[PODS]
    body = io.BytesIO()
    body.write(struct.pack(">bI", 0, v2_id))
    fastavro.schemaless_writer(
        body, fastavro.parse_schema(_schema(v2_text)), {**event.model_dump(), "priority_class": "high"}
    )
    # A consumer built against v1 (this codebase) decodes v2 data to the v1 record.
    assert AvroCodec(registry_client(platform.registry.url)).decode(topic, body.getvalue()) == event


def test_an_incompatible_change_is_refused_with_a_clear_error(platform, codec, unique) -> None:
    topic = _topic(platform, f"breaking-{unique}")
    codec.schema_id(topic)
    breaking = _v2_with({"name": "priority_class", "type": "string", "doc": "required, no default"})
    with pytest.raises(IncompatibleSchemaError) as caught:
        register(registry_client(platform.registry.url), topic.subject, breaking)
    message = str(caught.value)
    assert "BACKWARD" in message
    assert "reader field missing default value" in message
    assert "priority_class" in message


def test_compatibility_can_be_tested_without_registering(platform, codec, unique) -> None:
    topic = _topic(platform, f"probe-{unique}")
    codec.schema_id(topic)
    client = SchemaRegistryClient({"url": platform.registry.url})
    good = _v2_with({"name": "extra", "type": ["null", "long"], "default": None})
    bad = _v2_with({"name": "extra", "type": "long"})
    assert client.test_compatibility(topic.subject, Schema(good, "AVRO")) is True
    assert client.test_compatibility(topic.subject, Schema(bad, "AVRO")) is False
    assert client.get_latest_version(topic.subject).version == 1


def test_subject_level_none_allows_any_change(platform, codec, unique) -> None:
    topic = _topic(platform, f"free-{unique}")
    codec.schema_id(topic)
    client = SchemaRegistryClient({"url": platform.registry.url})
    client.set_compatibility(topic.subject, "NONE")
    assert client.get_compatibility(topic.subject) == "NONE"
    breaking = _v2_with({"name": "extra", "type": "long"})
    assert register(registry_client(platform.registry.url), topic.subject, breaking) > 0


def test_unknown_ids_and_subjects_are_404_with_confluent_codes(platform) -> None:
    client = SchemaRegistryClient({"url": platform.registry.url})
    with pytest.raises(SchemaRegistryError) as no_schema:
        client.get_schema(999_999)
    assert (no_schema.value.http_status_code, no_schema.value.error_code) == (404, 40403)
    with pytest.raises(SchemaRegistryError) as no_subject:
        client.get_latest_version("no-such-subject")
    assert (no_subject.value.http_status_code, no_subject.value.error_code) == (404, 40401)


def test_invalid_schema_is_422(platform) -> None:
    request = urllib.request.Request(
        f"{platform.registry.url}/subjects/x/versions",
        data=json.dumps({"schema": '{"type": "record", "name": "A"}'}).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    assert caught.value.code == 422
    assert json.loads(caught.value.read())["error_code"] == 42201


def test_deleted_subject_is_gone_but_its_ids_still_resolve(platform, unique) -> None:
    client = SchemaRegistryClient({"url": platform.registry.url})
    text = json.dumps({"type": "record", "name": f"D{unique}", "fields": [{"name": "a", "type": "long"}]})
    schema_id = register(registry_client(platform.registry.url), f"doomed-{unique}", text)
    assert client.delete_subject(f"doomed-{unique}") == [1]
    assert f"doomed-{unique}" not in client.get_subjects()
    assert _schema(registry_client(platform.registry.url).schema_text(schema_id)) == _schema(text)


def test_topic_spec_subject_uses_topic_name_strategy() -> None:
    assert replace(PODS, name="x").subject == "x-value"
