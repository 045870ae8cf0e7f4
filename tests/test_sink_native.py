"""GPU sample batches and device changes decoded by ClickHouse (``FORMAT AvroConfluent``) against
the sink's own Python decoder, on the real broker, registry and embedded engine: the same
records give the same rows, column for column, and a bad record among good ones goes to the
DLQ with the reason the Python decoder gives it while every good one is stored once."""

from __future__ import annotations

import math
import random
import struct
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from avro_damage import damaged
from confluent_kafka import Producer
from prometheus_client import REGISTRY
from sink_support import FAST, SinkThread, dead_letters, wait_for

from gpulens.consumers.clickhouse.exceptions import ClickHouseUnavailable
from gpulens.schemas.model.exceptions import DecodeError
from gpulens.schemas.model.models import ChangeType, DeviceChange, DeviceKind, GpuSample, GpuSampleBatch
from gpulens.schemas.model.topics import DEVICE_CHANGELOG, GPU_SAMPLES, TopicSpec
from gpulens.schemas.wire.codec import AvroCodec
from gpulens.testing.examples import example_events

PYTHON = FAST.model_copy(update={"decode_in_clickhouse": False})
ORDER = "cluster, node, device_id, event_time, event_id"


def _varied(cluster: str, count: int, rng: random.Random) -> list[GpuSampleBatch]:
    """Batches with every kind of value the model allows: nulls, bounds, big counters, text
    beyond ASCII, no samples at all, up to 16 GPUs."""
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=2)

    def maybe(value: float | int) -> float | int | None:
        return None if rng.random() < 0.2 else value

    def sample(i: int) -> GpuSample:
        return GpuSample(
            device_id=rng.choice([f"gpu-{i}", f"GPU-{i}-é✓", f"0000:{i:02x}:00.0"]),
            index=i,
            utilization_pct=maybe(rng.choice([0.0, 100.0, rng.uniform(0, 100)])),
            memory_used_bytes=maybe(rng.randrange(0, 2**62)),
            memory_total_bytes=maybe(rng.choice([0, 192 * 2**30])),
            temperature_edge_c=maybe(rng.uniform(0, 120)),
            temperature_junction_c=maybe(rng.uniform(0, 120)),
            temperature_memory_c=maybe(rng.uniform(0, 120)),
            power_watts=maybe(rng.uniform(0, 1500)),
            energy_joules=maybe(rng.uniform(0, 1e15)),
            sm_clock_mhz=maybe(rng.uniform(0, 3000)),
            memory_clock_mhz=maybe(rng.uniform(0, 3000)),
            pcie_bandwidth_mbps=maybe(rng.uniform(0, 64000)),
            ecc_correctable=maybe(rng.randrange(0, 2**40)),
            ecc_uncorrectable=maybe(rng.randrange(0, 2**40)),
        )

    return [
        GpuSampleBatch(
            event_id=f"{cluster}-{n}",
            cluster=cluster,
            event_time=start + timedelta(milliseconds=rng.randrange(0, 3_600_000)),
            source=rng.choice(["node-agent", "replay:alibaba-v2023", "agent-ü"]),
            node=rng.choice([f"node-{n % 7}", "nœud-1"]),
            samples=[sample(i) for i in range(rng.choice([0, 1, 8, 16]))],
        )
        for n in range(count)
    ]


def _changes(cluster: str, count: int, rng: random.Random) -> list[DeviceChange]:
    """Device changes of every kind, with text beyond ASCII and empty or filled field maps."""
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=2)
    fields = ["serial", "bdf", "vbios_version", "firmware_version", "vram_total_bytes", "numéro"]

    def change(n: int) -> DeviceChange:
        kind = rng.choice(list(ChangeType))
        changed = sorted(rng.sample(fields, rng.randrange(1, 4))) if kind is ChangeType.MODIFIED else []
        return DeviceChange(
            event_id=f"{cluster}-{n}",
            cluster=cluster,
            event_time=start + timedelta(milliseconds=rng.randrange(0, 3_600_000)),
            source=rng.choice(["gpulens-worker", "wörker"]),
            node=rng.choice([f"node-{n % 5}", "nœud-1"]),
            change=kind,
            device_kind=rng.choice(list(DeviceKind)),
            device_id=rng.choice([f"gpu-{n % 8}", f"mlx5_{n % 4}/1", "GPU-é✓"]),
            changed=changed,
            before={name: rng.choice(["", "A1", "ä"]) for name in changed},
            after={name: rng.choice(["B2", "✓"]) for name in changed},
        )

    return [change(n) for n in range(count)]


def _produce(platform, sink: SinkThread, values: list[bytes], spec: TopicSpec = GPU_SAMPLES) -> None:
    topic = sink.topics[spec.name]
    producer = Producer(platform.kafka.librdkafka(**{"linger.ms": 5}))
    for value in values:
        producer.produce(topic.name, key=b"k", value=value)
    assert producer.flush(30) == 0


def _rows(sink: SinkThread) -> list[tuple]:
    return sink.client().query(f"SELECT * FROM gpu_samples FINAL ORDER BY {ORDER}").result_rows


@pytest.fixture
def both(platform, codec, unique):
    """A sink that hands GPU samples to ClickHouse, and one that decodes them in Python."""
    native = SinkThread(platform, codec, f"{unique}n").start()
    python = SinkThread(platform, codec, f"{unique}p", PYTHON).start()
    yield native, python
    native.stop()
    python.stop()


def test_clickhouse_and_python_decoding_store_the_same_rows(platform, codec, both, unique) -> None:
    native, python = both
    records = _varied(f"same-{unique}", 600, random.Random(15))
    for sink in both:
        sink.publish(GPU_SAMPLES, records)
    expected = sum(len(r.samples) for r in records)
    for sink in both:
        sink.wait_rows("gpu_samples", expected, timeout=60)

    rows = _rows(native)
    assert len(rows) == expected
    assert rows == _rows(python), "every column of every row the same, whichever side decoded"
    assert native.scalar("SELECT count() FROM gpu_sample_batches") == 0, "the Null table keeps nothing"


def _bad_values(codec: AvroCodec, valid: GpuSampleBatch, rng: random.Random) -> list[bytes]:
    """Values the Python decoder refuses: damaged bytes of every kind, and valid Avro breaking
    the model's rules (whose ids are the valid record's: only a decodable one conflicts)."""
    value = codec.encode(GPU_SAMPLES, valid)
    gpu = valid.samples[0]
    rules = [
        *(valid.model_copy(update={"samples": [gpu.model_copy(update={"utilization_pct": v})]})
          for v in (math.nan, math.inf, -1.0, 100.5)),
        *(valid.model_copy(update={"samples": [gpu.model_copy(update={f: -1})]})
          for f in ("index", "memory_used_bytes", "ecc_uncorrectable")),
        valid.model_copy(update={"samples": [gpu.model_copy(update={"power_watts": -math.inf})]}),
        valid.model_copy(update={"node": ""}),
        valid.model_copy(update={"source": ""}),
        *(valid.model_copy(update={"event_time": at})
          for at in (datetime(2100, 1, 1, tzinfo=UTC), datetime(1999, 12, 31, 23, 59, 59, tzinfo=UTC),
                     datetime(9999, 12, 31, tzinfo=UTC), datetime(1, 1, 2, tzinfo=UTC))),
    ]  # fmt: skip
    junk = [
        b"\x07" + rng.randbytes(40),
        b"\x00\x00",
        struct.pack(">bI", 0, 999_999) + value[5:],
        value[:5] + b"\xff\xfe garbage \x00\x01",
        value[:5] + b"\x04\xff\xfe" + value[7:],  # an id that is no UTF-8
        value + b"\x00",  # a byte left over
        value[:-1],  # one short
    ]
    variants = [v for v in damaged(value, rng) if _refused(codec, v)]
    return [
        *(codec.encode(GPU_SAMPLES, record) for record in rules),
        *junk,
        *rng.sample(variants, 120),
    ]


def _refused(codec: AvroCodec, value: bytes, spec: TopicSpec = GPU_SAMPLES) -> bool:
    try:
        codec.decode(spec, value)
    except DecodeError:
        return True
    return False


def _reason(codec: AvroCodec, value: bytes, spec: TopicSpec = GPU_SAMPLES) -> str:
    try:
        codec.decode(spec, value)
    except DecodeError as err:
        return err.reason.value
    raise AssertionError("a value the decoder reads is no bad value")


def test_a_refused_batch_is_split_and_each_bad_record_dead_lettered_with_the_decoders_reason(
    platform, codec, unique
) -> None:
    rng = random.Random(2026)
    cluster = f"bad-{unique}"
    good = _varied(cluster, 400, rng)
    template = example_events(cluster)[GPU_SAMPLES]
    valid = template.model_copy(update={"event_id": f"{cluster}-bad"})
    bad = _bad_values(codec, valid, rng)
    for value in bad:
        assert _refused(codec, value), value
    sink = SinkThread(platform, codec, unique).start()
    try:
        topic = sink.topics[GPU_SAMPLES.name]
        values = [codec.encode(topic, r) for r in good] + bad
        rng.shuffle(values)
        _produce(platform, sink, values)
        letters = dead_letters(platform, codec, {topic.name}, len(bad), timeout=120)
        expected_samples = sum(len(r.samples) for r in good)
        sink.wait_rows("gpu_samples", expected_samples, timeout=60)
        rows = sink.scalar(f"SELECT count() FROM gpu_samples WHERE cluster = '{cluster}'")
        ids = sink.scalar(f"SELECT uniqExact(event_id) FROM gpu_samples WHERE cluster = '{cluster}'")
    finally:
        sink.stop()

    assert Counter(letter.reason for letter in letters) == Counter(_reason(codec, v) for v in bad)
    assert sorted(letter.value or b"" for letter in letters) == sorted(bad), "each bad record once"
    assert rows == expected_samples, "every good sample stored once (no part of a batch twice)"
    assert ids == sum(1 for r in good if r.samples)


def test_clickhouse_and_python_decoding_store_the_same_device_changelog_rows(
    platform, codec, both, unique
) -> None:
    native, python = both
    records = _changes(f"dev-{unique}", 500, random.Random(19))
    for sink in both:
        sink.publish(DEVICE_CHANGELOG, records)
        sink.wait_rows("device_changelog", len(records), timeout=60)

    query = f"SELECT * FROM device_changelog FINAL ORDER BY {ORDER}"
    rows = native.client().query(query).result_rows
    assert len(rows) == len(records)
    assert rows == python.client().query(query).result_rows, "the same rows, whichever side decoded"
    assert native.scalar("SELECT count() FROM device_changes") == 0, "the Null table keeps nothing"


def test_a_device_change_emitted_again_with_other_content_replaces_its_row(platform, codec, unique) -> None:
    """The worker's outputs are no producers' events: a window or change written again (after a
    restore) replaces the row, never goes to the DLQ as a conflicting duplicate."""
    first = _changes(f"again-{unique}", 1, random.Random(3))[0]
    again = first.model_copy(update={"source": f"{first.source}-again"})
    sink = SinkThread(platform, codec, unique).start()
    try:
        sink.publish(DEVICE_CHANGELOG, [first])
        sink.wait_rows("device_changelog", 1)
        sink.publish(DEVICE_CHANGELOG, [again])
        sink.wait_rows("device_changelog", 1, where=f"source = '{again.source}'")
    finally:
        sink.stop()
    assert not dead_letters(platform, codec, {sink.topics[DEVICE_CHANGELOG.name].name}, 1, timeout=3)


def test_bad_device_changes_are_dead_lettered_with_the_decoders_reason_and_the_good_ones_stored(
    platform, codec, unique
) -> None:
    rng = random.Random(2027)
    cluster = f"badchange-{unique}"
    good = _changes(cluster, 300, rng)
    valid = _changes(f"{cluster}-x", 1, rng)[0]
    value = codec.encode(DEVICE_CHANGELOG, valid)
    bad = [
        *(codec.encode(DEVICE_CHANGELOG, valid.model_copy(update=update)) for update in (
            {"node": ""}, {"source": ""}, {"cluster": ""}, {"event_time": datetime(2100, 1, 1, tzinfo=UTC)},
            {"event_time": datetime(1999, 12, 31, tzinfo=UTC)},
        )),
        *rng.sample([v for v in damaged(value, rng) if _refused(codec, v, DEVICE_CHANGELOG)], 60),
    ]  # fmt: skip
    refused = {"table": "device_changes"}
    refused_before = REGISTRY.get_sample_value("gpulens_sink_refused_inserts_total", refused) or 0
    sink = SinkThread(platform, codec, unique).start()
    try:
        values = [codec.encode(DEVICE_CHANGELOG, r) for r in good] + bad
        rng.shuffle(values)
        _produce(platform, sink, values, DEVICE_CHANGELOG)
        topic = sink.topics[DEVICE_CHANGELOG.name].name
        letters = dead_letters(platform, codec, {topic}, len(bad), timeout=120)
        sink.wait_rows("device_changelog", len(good), where=f"cluster = '{cluster}'", timeout=60)
        stored = sink.scalar(f"SELECT count() FROM device_changelog WHERE cluster = '{cluster}'")
    finally:
        sink.stop()

    assert Counter(letter.reason for letter in letters) == Counter(
        _reason(codec, v, DEVICE_CHANGELOG) for v in bad
    )
    assert sorted(letter.value or b"" for letter in letters) == sorted(bad), "each bad record once"
    assert stored == len(good), "every good change stored once"
    assert (REGISTRY.get_sample_value("gpulens_sink_refused_inserts_total", refused) or 0) > refused_before, (
        "ClickHouse was handed the changes and refused the bad ones"
    )


def test_records_wait_while_clickhouse_cannot_reach_the_registry_and_are_stored_once_after(
    platform, codec, unique
) -> None:
    """A registry outage is not the records' fault (as for the Python decoder): nothing is
    dead-lettered or committed, and a sink that reaches it stores every record once."""
    cluster = f"noreg-{unique}"
    records = _varied(cluster, 150, random.Random(7))
    expected = sum(len(r.samples) for r in records)
    retries = {"operation": "insert gpu_samples"}
    before = REGISTRY.get_sample_value("gpulens_sink_retries_total", retries) or 0
    blind = SinkThread(platform, codec, unique, registry_url="http://127.0.0.1:9").start()  # nobody there
    blind.publish(GPU_SAMPLES, records)
    wait_for(
        lambda: (REGISTRY.get_sample_value("gpulens_sink_retries_total", retries) or 0) >= before + 3,
        60,
        "inserts retried",
    )
    assert blind.scalar("SELECT count() FROM gpu_samples") == 0
    with pytest.raises(ClickHouseUnavailable):
        blind.stop()

    sink = SinkThread(platform, codec, unique).start()
    try:
        sink.wait_rows("gpu_samples", expected, timeout=60)
        assert sink.scalar("SELECT count() FROM gpu_samples") == expected
    finally:
        sink.stop()
    assert not dead_letters(platform, codec, {sink.topics[GPU_SAMPLES.name].name}, 1, timeout=3)
