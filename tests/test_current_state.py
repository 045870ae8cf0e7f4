"""A subscriber of the compacted state topics gets the cluster as it is now: the newest row of
every key, nothing of what was tombstoned."""

from __future__ import annotations

from confluent_kafka import Producer
from pod_events import pod

from gpulens.current_state import clusters_now, read_newest
from gpulens.pipeline.state_tables import STATE_TOPIC_OF, StateTables, Tombstone
from gpulens.schemas.kafka.settings import KafkaSettings
from gpulens.schemas.model.models import ChangeType, Record, WorkloadStatus
from gpulens.schemas.model.topics import STATE_PODS, record_key
from gpulens.schemas.wire.codec import AvroCodec


def publish(kafka: KafkaSettings, codec: AvroCodec, rows: list[Record | Tombstone]) -> None:
    producer = Producer(kafka.librdkafka(**{"enable.idempotence": True}))
    for row in rows:
        if isinstance(row, Tombstone):
            producer.produce(row.topic.name, key=row.key, value=None)
        else:
            topic = STATE_TOPIC_OF[type(row)]
            producer.produce(topic.name, key=record_key(topic, row), value=codec.encode(topic, row))
    assert producer.flush(30) == 0


def test_a_tombstoned_key_is_gone_and_a_rewritten_one_holds_its_newest_row(platform, codec, unique) -> None:
    cluster = f"now-{unique}"
    tables = StateTables()
    rows: list[Record | Tombstone] = []
    for event in (
        pod(cluster, "a", "Pending", 1, [], gpu_amount=1.0),
        pod(cluster, "a", "Running", 2, [], gpu_amount=1.0),
        pod(cluster, "b", "Running", 3, [], gpu_amount=1.0),
        pod(cluster, "c", "Running", 4, [], gpu_amount=1.0),
        pod(cluster, "c", "Succeeded", 5, [], ChangeType.DELETED, gpu_amount=1.0),
    ):
        rows += tables.process(event)
    publish(platform.kafka, codec, rows)

    mine = {
        key: codec.decode(STATE_PODS, value)
        for key, value in read_newest(platform.kafka, STATE_PODS).items()
        if key.startswith(f"{cluster}/".encode())
    }
    assert {key: p.phase for key, p in mine.items()} == {
        f"{cluster}/a".encode(): "Running",
        f"{cluster}/b".encode(): "Running",
    }

    now = clusters_now(platform.kafka, codec)[cluster]
    assert dict(now.pods) == {"Running": 2}
    assert dict(now.workloads) == {WorkloadStatus.RUNNING.value: 2}, "bare pods a and b; c went with its pod"
    assert now.gpus_held == 2.0
    assert sorted(w.name for w in now.top) == ["a", "b"]
