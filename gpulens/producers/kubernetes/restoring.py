"""Read back the last state this watcher published, from the topics themselves.

Why the topics and not a local file: they are the truth every replica shares, so a restarted
watcher and a newly elected leader (another pod, with no disk in common) both continue from
exactly what was published: what was acknowledged is known, what was not is published again
after the relist. Cost: one read of the four topics' retention at start and at every change
of leader; records of other clusters and other sources are skipped before validation.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import defaultdict

from confluent_kafka import Consumer, KafkaException, TopicPartition

from gpulens.producers.kubernetes.exceptions import StateRestoreError
from gpulens.producers.kubernetes.reconciling import PublishedState
from gpulens.producers.kubernetes.resources import NODES, PERSISTENT_VOLUMES, PODS, TOPICS, kind_key
from gpulens.schemas.kafka.settings import KafkaSettings
from gpulens.schemas.model.exceptions import DecodeError
from gpulens.schemas.model.models import ChangeType, Event, NodeEvent, StorageEvent, WorkloadEvent
from gpulens.schemas.wire.codec import AvroCodec

log = logging.getLogger(__name__)


def read_published(
    kafka: KafkaSettings, codec: AvroCodec, *, cluster: str, source: str, timeout_s: float = 120.0
) -> PublishedState:
    """The last event of every entity ``source`` published for ``cluster`` and did not delete."""
    specs = {spec.name: spec for spec in TOPICS.values()}
    consumer = Consumer(
        kafka.librdkafka(
            **{"group.id": f"gpulens-watcher-restore-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False}
        )
    )
    latest: dict[tuple[str, str], Event] = {}
    try:
        ends = _assign_to_end(consumer, list(specs))
        remaining = {tp for tp, end in ends.items() if end > 0}
        deadline = time.monotonic() + timeout_s
        while remaining:
            if time.monotonic() > deadline:
                raise StateRestoreError(f"topics not read to their end within {timeout_s:.0f}s: {remaining}")
            for msg in consumer.consume(1000, timeout=0.5):
                if msg.error():
                    raise StateRestoreError(f"reading {msg.topic()}[{msg.partition()}]: {msg.error()}")
                topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
                if topic is None or partition is None or offset is None or offset >= ends[(topic, partition)]:
                    continue
                if offset + 1 >= ends[(topic, partition)]:
                    remaining.discard((topic, partition))
                spec = specs[topic]
                try:
                    values = codec.decode_dict(spec, msg.value() or b"")
                except DecodeError as err:  # consumers dead-letter these; here they are no state
                    log.warning("%s[%d]@%d skipped: %s", topic, partition, offset, err)
                    continue
                if values.get("cluster") != cluster or values.get("source") != source:
                    continue
                event: Event = spec.record.model_validate(values)  # type: ignore[assignment]
                latest[(_resource_key(event), str(values[spec.key_field]))] = event
    except KafkaException as err:
        raise StateRestoreError(f"reading back the published state: {err}") from err
    finally:
        consumer.close()
    state: defaultdict[str, dict[str, Event]] = defaultdict(dict)
    for (resource_key, entity), event in latest.items():
        if getattr(event, "type", None) is not ChangeType.DELETED:
            state[resource_key][entity] = event
    return state


def _assign_to_end(consumer: Consumer, topics: list[str]) -> dict[tuple[str, int], int]:
    """Assign every partition from its first offset; the end offset of each, taken now."""
    metadata = consumer.list_topics(timeout=10).topics
    ends: dict[tuple[str, int], int] = {}
    assignment = []
    for topic in topics:
        if topic not in metadata or metadata[topic].error is not None:
            raise StateRestoreError(f"topic {topic} does not exist; run `gpulens topics create`")
        for partition in metadata[topic].partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            ends[(topic, partition)] = high if high > low else 0
            assignment.append(TopicPartition(topic, partition, low))
    consumer.assign(assignment)
    return ends


def _resource_key(event: Event) -> str:
    if isinstance(event, WorkloadEvent):
        return kind_key(event.group, event.kind)
    if isinstance(event, StorageEvent):
        return PERSISTENT_VOLUMES.key
    return NODES.key if isinstance(event, NodeEvent) else PODS.key
