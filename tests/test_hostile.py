"""Hostile input and broker faults never stop the worker or the sink: bursts of garbage,
oversize values, a broker that does not answer for seconds, a log recreated under a checkpoint.

These tests pour garbage onto the catalog's own input topics (or freeze the broker), so each
runs on a private platform of its own: the session's topics (and the next test's) stay clean.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import struct
import time
from collections import Counter
from collections.abc import Iterator

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from hostile_support import DeadLetterReader, metric, start, wait

from gpulens.config import GPULensSettings
from gpulens.consumers.clickhouse.client import get_client
from gpulens.platform import BROKER, free_port, manager
from gpulens.schemas.kafka.dead_letters import MAX_ORIGINAL_BYTES
from gpulens.schemas.kafka.producing import produce_with_backpressure
from gpulens.schemas.kafka.topic_admin import TopicAdminError, create_topics
from gpulens.schemas.model.exceptions import DecodeFailure
from gpulens.schemas.model.topics import NODES, PODS, TopicSpec, record_key
from gpulens.schemas.wire.codec import AvroCodec, registry_client
from gpulens.testing.examples import example_events

GARBAGE = 20_000
"""A burst of garbage on one topic (tests/test_fuzz.py pours 200,000 on three, with a replay)."""
JUNK_BYTES = 999_000


def _garbage(codec: AvroCodec, spec: TopicSpec) -> Iterator[tuple[bytes, DecodeFailure]]:
    """Undecodable values, each with the reason it must be dead-lettered with."""
    avro_garbage = struct.pack(">bI", 0, codec.schema_id(spec)) + b"\xff\xfe garbage \x00\x01"
    rnd = random.Random(13)
    for i in range(GARBAGE):
        kind = i % 3
        if kind == 0:
            yield (
                bytes([rnd.randrange(1, 256)]) + rnd.randbytes(rnd.randrange(4, 60)),
                DecodeFailure.BAD_MAGIC,
            )
        elif kind == 1:
            yield rnd.randbytes(rnd.randrange(0, 5)), DecodeFailure.TRUNCATED
        else:
            yield avro_garbage, DecodeFailure.AVRO_DECODE


def test_a_burst_of_garbage_is_dead_lettered_and_the_worker_stays_up(
    own_platform, own_codec, unique, spawned
) -> None:
    settings, config = own_platform
    group, port = f"burst-{unique}", free_port()
    producer = Producer(settings.kafka.librdkafka(**{"linger.ms": 20}))
    injected: Counter[str] = Counter()
    for value, reason in _garbage(own_codec, PODS):
        produce_with_backpressure(producer, PODS.name, key=b"garbage", value=value)
        injected[reason.value] += 1
    assert producer.flush(60) == 0
    log = config.parent / f"worker-{group}.log"
    worker = start(
        config, log, "worker", "--processors", "allocation", "--group", group,
        "--idle-ms", "1000", "--metrics-port", str(port),
    )  # fmt: skip
    spawned.append(worker)
    reader = DeadLetterReader(settings, own_codec, decode_every=1000)
    try:
        wait(lambda: reader.read() >= GARBAGE, 180, f"{GARBAGE:,} dead letters", worker)
        reader.read()  # more would be a duplicate
    finally:
        reader.close()
    assert worker.poll() is None, "the worker stays up"
    assert Counter(h["reason"].decode() for h in reader.headers) == injected
    sources = sorted(int(h["source"].rsplit(b"/", 1)[1]) for h in reader.headers)
    assert sources == list(range(GARBAGE)), "every record dead-lettered once"
    assert {letter.consumer for letter in reader.letters} == {group}
    assert all(letter.source_topic == PODS.name and letter.value is not None for letter in reader.letters)
    assert metric(port, "gpulens_dead_letters_total") == GARBAGE
    lines = [line for line in log.read_text().splitlines() if "dead letter" in line]
    assert 1 <= len(lines) <= 60, f"dead-letter logs are rate-limited: {len(lines)} lines"


def test_oversize_values_are_dead_lettered_truncated_and_later_records_are_stored(
    own_platform, own_codec, unique, spawned
) -> None:
    settings, config = own_platform
    worker_group, sink_group = f"big-w-{unique}", f"big-s-{unique}"
    junk = [b"\x07" + random.Random(i).randbytes(JUNK_BYTES - 1) for i in range(4)]
    producer = Producer(settings.kafka.librdkafka(**{"message.max.bytes": 1_000_000}))
    for value in junk:
        producer.produce(NODES.name, key=b"junk", value=value)
    assert producer.flush(60) == 0
    worker = start(
        config, config.parent / f"worker-{worker_group}.log",
        "worker", "--processors", "allocation", "--group", worker_group, "--idle-ms", "1000",
    )  # fmt: skip
    sink = start(config, config.parent / f"sink-{sink_group}.log", "sink", "--group", sink_group)
    spawned += [worker, sink]
    reader = DeadLetterReader(settings, own_codec)
    try:
        wait(lambda: reader.read() >= 8, 120, "8 dead letters (4 from each)", worker, sink)
        reader.read()
    finally:
        reader.close()
    digests = {hashlib.sha256(value).hexdigest(): value for value in junk}
    assert Counter(letter.consumer for letter in reader.letters) == {worker_group: 4, sink_group: 4}
    for letter in reader.letters:
        original = digests[letter.value_sha256 or ""]
        assert letter.value_truncated
        assert letter.value_length == JUNK_BYTES
        assert letter.value == original[:MAX_ORIGINAL_BYTES]
        assert letter.reason == DecodeFailure.BAD_MAGIC.value

    node = example_events(f"after-{unique}")[NODES]
    producer.produce(NODES.name, key=record_key(NODES, node), value=own_codec.encode(NODES, node))
    assert producer.flush(30) == 0
    client = get_client(settings.clickhouse, database=settings.clickhouse.database)
    wait(
        lambda: (
            client.query(
                "SELECT count() FROM node_events WHERE cluster = {c:String}", parameters={"c": node.cluster}
            ).result_rows[0][0]
            == 1
        ),
        60,
        "the valid node stored after the junk",
        worker,
        sink,
    )
    stored = (
        "SELECT value_length, value_sha256, value_truncated, length(value) FROM dead_letters FINAL"
        " WHERE source_topic = {t:String}"
    )  # one row per source record: the worker's letter and the sink's share their key
    wait(
        lambda: len(client.query(stored, parameters={"t": NODES.name}).result_rows) == len(junk),
        60,
        "the junk's dead letters in ClickHouse",
        worker,
        sink,
    )
    rows = client.query(stored, parameters={"t": NODES.name}).result_rows
    assert sorted(rows) == sorted(
        (len(value), hashlib.sha256(value).hexdigest(), True, MAX_ORIGINAL_BYTES) for value in junk
    )
    assert worker.poll() is None and sink.poll() is None


def test_a_broker_that_stops_answering_for_seconds_is_waited_out(own_platform, unique, spawned) -> None:
    settings, config = own_platform
    worker_group, sink_group, port = f"stall-w-{unique}", f"stall-s-{unique}", free_port()
    producer = Producer(settings.kafka.librdkafka())
    produce_with_backpressure(producer, PODS.name, key=b"k", value=b"\x07 before the stall")
    assert producer.flush(30) == 0
    worker = start(
        config, config.parent / f"worker-{worker_group}.log",
        "worker", "--processors", "allocation", "--group", worker_group,
        "--idle-ms", "1000", "--metrics-port", str(port),
    )  # fmt: skip
    sink = start(config, config.parent / f"sink-{sink_group}.log", "sink", "--group", sink_group)
    spawned += [worker, sink]
    reader = DeadLetterReader(settings, AvroCodec(registry_client(settings.registry.url)))
    try:
        wait(lambda: reader.read() >= 2, 60, "the first dead letter from each", worker, sink)
        broker = manager(settings).status(BROKER).pid
        assert broker is not None
        os.killpg(broker, signal.SIGSTOP)  # end offsets and metadata time out meanwhile
        try:
            wait(
                lambda: metric(port, "gpulens_kafka_transient_errors_total") > 0,
                30,
                "the worker to count a broker call that timed out",
                worker,
                sink,
            )
        finally:
            os.killpg(broker, signal.SIGCONT)
        produce_with_backpressure(producer, PODS.name, key=b"k", value=b"\x07 after the stall")
        assert producer.flush(30) == 0
        wait(lambda: reader.read() >= 4, 90, "the second dead letter from each", worker, sink)
    finally:
        reader.close()
    assert worker.poll() is None and sink.poll() is None
    assert Counter(letter.consumer for letter in reader.letters) == {worker_group: 2, sink_group: 2}


def _recreate(settings: GPULensSettings, spec: TopicSpec) -> None:
    """Delete ``spec``'s topic and create it again, empty: a broker that lost its log."""
    admin = AdminClient(settings.kafka.librdkafka())
    admin.delete_topics([spec.name])[spec.name].result(30)
    deadline = time.monotonic() + 30
    while True:
        try:
            if create_topics(settings.kafka, [spec]) == [spec.name]:
                return
        except TopicAdminError:  # still being deleted
            pass
        assert time.monotonic() < deadline, f"{spec.name} not created again within 30 s"
        time.sleep(0.5)


def test_a_worker_checkpointed_past_a_lost_log_resumes_at_its_end_and_reads_what_comes_next(
    own_platform, own_codec, unique, spawned
) -> None:
    settings, config = own_platform
    group = f"lost-{unique}"
    producer = Producer(settings.kafka.librdkafka())
    for n in range(10):
        produce_with_backpressure(producer, PODS.name, key=b"k", value=b"\x07 old %d" % n)
    assert producer.flush(30) == 0
    log = config.parent / f"worker-{group}.log"
    args = ("worker", "--processors", "allocation", "--group", group, "--idle-ms", "1000")
    first = start(config, log, *args)
    spawned.append(first)
    reader = DeadLetterReader(settings, own_codec)
    try:
        wait(lambda: reader.read() >= 10, 60, "the first worker's 10 dead letters", first)
        first.terminate()
        assert first.wait(60) == 0
        _recreate(settings, PODS)
        port = free_port()
        second = start(config, log, *args, "--metrics-port", str(port))
        spawned.append(second)
        wait(
            lambda: metric(port, "gpulens_consumer_offset_resets_total") >= 1,
            60,
            "the checkpointed offset past the new end to be reset",
            second,
        )
        for n in range(3):  # at offsets the first worker had processed in the lost log
            produce_with_backpressure(producer, PODS.name, key=b"k", value=b"\x07 new %d" % n)
        assert producer.flush(30) == 0
        wait(lambda: reader.read() >= 13, 60, "the new records dead-lettered", second)
        reader.read()  # more would be old records read again
    finally:
        reader.close()
    new = reader.letters[10:]
    assert [letter.value for letter in new] == [b"\x07 new %d" % n for n in range(3)]
    assert [letter.source_offset for letter in new] == [0, 1, 2]
    assert metric(port, "gpulens_consumer_offset_resets_total") == 1
    assert second.poll() is None
