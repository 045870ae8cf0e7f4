"""A state log against the real broker: a restore reads from the newest complete snapshot on.

A writer without transactions (the exporter) can be killed in the middle of a snapshot; the
restore must then start at the snapshot before and still see every key's newest value.
"""

from __future__ import annotations

from confluent_kafka import Producer

from schemas.state_log import FIRST_SPAN, SNAPSHOT_MARKER, StateLog


def test_a_snapshot_cut_short_is_passed_over_and_every_newest_value_comes_back(platform, unique) -> None:
    log = StateLog(platform.kafka, f"test.state-log.{unique}", min_between=1)
    log.create()
    producer = Producer(platform.kafka.librdkafka(**{"enable.idempotence": True}))
    live: dict[bytes, bytes] = {}

    def write(entries: dict[bytes, bytes | None]) -> None:
        log.append(producer, entries.items())
        for key, value in entries.items():
            if value is None:
                live.pop(key, None)
            else:
                live[key] = value

    history = 0
    for round_ in range(200):  # 200 rounds over 100 keys: 20,000 records of history
        write({f"k{i}".encode(): f"{round_}".encode() for i in range(100)})
        history += 100
    log.snapshot(producer, lambda: list(live.items()), len(live))  # complete: 102 records
    write({b"k1": b"after", b"k2": None})
    # a snapshot cut short: its marker and 10 of its 99 entries, then the writer is gone
    producer.produce(log.topic, key=SNAPSHOT_MARKER, value=str(len(live)).encode())
    for key, value in list(live.items())[:10]:
        producer.produce(log.topic, key=key, value=value)
    write({b"k3": b"restarted", b"new": b"1"})  # the next incarnation writes on
    assert producer.flush(30) == 0

    restored = StateLog(platform.kafka, log.topic).restore()
    assert restored.entries == live
    assert restored.records_read <= FIRST_SPAN < history, "read from near the snapshot, not the history"
