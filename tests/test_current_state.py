"""A subscriber of the compacted state topics gets the cluster as it is now: the newest row of
every key, nothing of what was tombstoned."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from confluent_kafka import Producer

from gpulens.current_state import clusters_now, read_newest
from pipeline.state_tables import STATE_TOPIC_OF, StateTables, Tombstone
from schemas.codec import AvroCodec
from schemas.examples import example_events
from schemas.models import ChangeType, PodEvent, Record, WorkloadStatus
from schemas.settings import KafkaSettings
from schemas.topics import PODS, STATE_PODS, record_key

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def pod(
    cluster: str, name: str, phase: str, second: int, change: ChangeType = ChangeType.MODIFIED
) -> PodEvent:
    template = example_events(cluster, at=T0)[PODS]
    assert isinstance(template, PodEvent)
    return template.model_copy(
        update={
            "event_id": f"{name}-{second}-{change.value}",
            "event_time": T0 + timedelta(seconds=second),
            "uid": name,
            "name": name,
            "phase": phase,
            "type": change,
            "gpu_amount": 1.0,
            "owners": [],
        }
    )


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
        pod(cluster, "a", "Pending", 1),
        pod(cluster, "a", "Running", 2),
        pod(cluster, "b", "Running", 3),
        pod(cluster, "c", "Running", 4),
        pod(cluster, "c", "Succeeded", 5, ChangeType.DELETED),
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
