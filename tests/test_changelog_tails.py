"""The end of a changelog partition, as `gpulens tables` recovery takes it: its last committed
record, not the transaction markers and aborted records after it (faust waited 10 s for
those at every start)."""

from __future__ import annotations

from collections.abc import Callable

from confluent_kafka import Consumer, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from faust.types import TP

from gpulens.config import GPULensSettings
from gpulens.pipeline.entity_tables.recovery import FIRST_TAIL, ChangelogTails


def transactions(platform: GPULensSettings, unique: str) -> Callable[[int, int, bool], list[int]]:
    """``write(partition, count, commit)``: one transaction of ``count`` records, committed or
    aborted; the offsets the broker acknowledged."""
    producer = Producer(platform.kafka.librdkafka(**{"transactional.id": f"tails-{unique}", "linger.ms": 0}))
    producer.init_transactions(30)

    def write(partition: int, count: int, commit: bool) -> list[int]:
        offsets: list[int] = []

        def acked(err: object, message: Message) -> None:
            assert err is None, err
            offsets.append(message.offset())

        producer.begin_transaction()
        for i in range(count):
            producer.produce(
                f"changelog-{unique}", f"v{i}".encode(), b"k", partition=partition, on_delivery=acked
            )
        producer.flush(30)
        (producer.commit_transaction if commit else producer.abort_transaction)(30)
        return offsets

    return write


def ends(platform: GPULensSettings, topic: str, partitions: int) -> dict[TP, int]:
    probe = Consumer(platform.kafka.librdkafka(**{"group.id": "tails-probe"}))
    try:
        return {
            TP(topic, p): probe.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        }
    finally:
        probe.close()


def test_the_end_of_a_changelog_is_its_last_committed_record(platform: GPULensSettings, unique: str) -> None:
    topic = f"changelog-{unique}"
    admin = AdminClient(platform.kafka.librdkafka())
    admin.create_topics([NewTopic(topic, 4, 1)])[topic].result(30)
    write = transactions(platform, unique)
    committed = write(0, 3, True)
    write(0, 2, False)  # a killed incarnation's transaction, aborted at the next start
    write(1, 5, True)
    last_of_1 = write(1, 1, True)
    before_aborted = write(2, 20, True)
    write(2, FIRST_TAIL + 200, False)
    write(3, 4, False)  # nothing committed at all

    found = ChangelogTails(platform.kafka).last_records(ends(platform, topic, 4))

    assert found[TP(topic, 0)] == committed[-1]
    assert found[TP(topic, 1)] == last_of_1[-1]
    assert found[TP(topic, 2)] == before_aborted[-1], "read further back past a long aborted tail"
    assert found[TP(topic, 3)] == -1


def test_an_empty_changelog_partition_has_no_end_to_wait_for(platform: GPULensSettings, unique: str) -> None:
    topic = f"changelog-{unique}"
    admin = AdminClient(platform.kafka.librdkafka())
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    assert ChangelogTails(platform.kafka).last_records(ends(platform, topic, 1)) == {}
