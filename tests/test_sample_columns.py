"""GPU sample batches read by column read exactly what the exact path reads, or are left to it.

The reference is the exact path, computed independently (``fastavro.schemaless_reader`` over
the committed schema, then ``model_validate``: ``exact`` of the generated reader's test). A
fetch mixes random batches (every union branch, empty and multi-block sample arrays, non-ASCII
strings, NaN, infinities, out-of-range values and times), every damaged variant of a producer
batch, and other schema ids; each value read by column must hold the exact record's fields.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from avro_damage import damaged
from test_compiled_reader import RandomRecords, exact

from gpulens.pipeline.alerting import AlertRules
from gpulens.pipeline.idle_owners import IdleRules
from gpulens.pipeline.operators import (
    INPUT_ORDER,
    AlertOperator,
    AllocationOperator,
    Given,
    IdleOwnersOperator,
    LatestSamplesOperator,
    Operator,
    WorkloadUsageOperator,
)
from gpulens.pipeline.windows import TumblingWindows
from gpulens.producers.simulate import ClusterSimulation, SimulationSpec
from gpulens.schemas.model.avro_schema import committed
from gpulens.schemas.model.models import Alert, Event, GpuSampleBatch, IdleGpuHours
from gpulens.schemas.model.topics import GPU_SAMPLES, PODS
from gpulens.schemas.wire.codec import AvroCodec
from gpulens.schemas.wire.compiled_writer import _long
from gpulens.schemas.wire.sample_columns import SMALLEST, NativeSampleDecoder, SampleColumns, readings
from gpulens.testing.examples import example_events

TOPIC_OF = {spec.record: spec for spec in INPUT_ORDER}
IDLE_RULES = IdleRules(
    idle_below=5.0, compute_idle_below=1.0, memory_floor_bytes=1 << 30, sample_valid_ms=10_000
)


def same(columns: SampleColumns, record: GpuSampleBatch) -> bool:
    fields = ("event_id", "cluster", "event_time", "source", "node")
    return (
        [getattr(columns, f) for f in fields] == [getattr(record, f) for f in fields]
        and list(readings(columns)) == list(readings(record))
        and columns.memories == [sample.memory_used_bytes for sample in record.samples]
    )


def check(codec: AvroCodec, values: list[bytes]) -> int:
    """Decode ``values`` as one fetch; every value read by column is the exact record. How many were."""
    read = 0
    for value, columns in zip(values, NativeSampleDecoder(codec, GPU_SAMPLES).decode(values), strict=True):
        if columns is None:
            continue
        record = exact(GpuSampleBatch, value[5:]) if value[:1] == b"\x00" else None
        assert isinstance(record, GpuSampleBatch), value.hex()
        assert value[1:5] == codec.schema_id(GPU_SAMPLES).to_bytes(4), value.hex()
        assert same(columns, record), value.hex()
        assert columns.batch() == record
        read += 1
    return read


def read_by_column(codec: AvroCodec, events: Iterable[Event]) -> list[Given]:
    """``events`` with every GPU sample batch as the worker reads it from a fetch: by column."""
    given: list[Given] = list(events)
    at = [i for i, event in enumerate(given) if isinstance(event, GpuSampleBatch)]
    wires = [codec.encode(GPU_SAMPLES, given[i]) for i in at]  # type: ignore[arg-type]
    decoder = NativeSampleDecoder(codec, GPU_SAMPLES)
    columns = [
        c for start in range(0, len(wires), 1_000) for c in decoder.decode(wires[start : start + 1_000])
    ]
    assert None not in columns
    for i, batch in zip(at, columns, strict=True):
        given[i] = batch  # type: ignore[assignment]
    return given


def test_random_batches_read_by_column_as_the_exact_path_reads_them(codec: AvroCodec) -> None:
    records = RandomRecords(random.Random(7))
    schema: Any = json.loads(committed(GpuSampleBatch))
    values = [codec.encode_dict(GPU_SAMPLES, records.value(schema)) for _ in range(3_000)]
    read = check(codec, values)
    assert 0 < read < len(values)  # the generator reaches both valid and refused batches


def test_damaged_batches_are_read_exactly_or_left_to_the_exact_path(codec: AvroCodec) -> None:
    wire = codec.encode(GPU_SAMPLES, example_events("columns")[GPU_SAMPLES])
    values = [wire, *damaged(wire, random.Random(3)), codec.encode(PODS, example_events("columns")[PODS])]
    assert check(codec, values) > 1  # the intact batch, and damage that still makes a valid batch


def test_a_fetch_of_valid_batches_is_read_whole_by_column(codec: AvroCodec) -> None:
    batch = example_events("columns")[GPU_SAMPLES]
    values = [codec.encode(GPU_SAMPLES, batch.model_copy(update={"node": f"n{i}"})) for i in range(SMALLEST)]
    assert check(codec, values) == SMALLEST
    assert check(codec, values[:-1]) == 0  # too few to be worth a columnar read
    header_only = values[0][:5]  # refused (truncated), it says nothing of the batches after it
    assert check(codec, [header_only, *values]) == SMALLEST
    many = batch.model_copy(update={"samples": batch.samples * 65})  # more GPUs than read by column
    assert check(codec, [*values, codec.encode(GPU_SAMPLES, many)]) == SMALLEST


def test_the_operators_give_the_same_rows_and_state_from_columns_as_from_models(codec: AvroCodec) -> None:
    """A simulated fleet through every operator reading samples, once with the batches as models
    and once as read by column: the same rows in the same order, and the same state after."""
    spec = SimulationSpec(
        nodes=100, gpus_per_node=8, interval_s=2.0, start=datetime(2025, 1, 1, tzinfo=UTC),
        duration_s=150, cluster="columns",
    )  # fmt: skip
    events: list[Event] = [event for _, event in ClusterSimulation(spec).events()]
    read = read_by_column(codec, events)

    def run(given: list[Given]) -> tuple[list[Any], dict[str, Any]]:
        operators: list[Operator] = [
            AllocationOperator(TumblingWindows(30_000), per_node=True, overview=True),
            WorkloadUsageOperator(TumblingWindows(30_000)),
            IdleOwnersOperator(TumblingWindows(30_000), IDLE_RULES),  # memory-idle by the VRAM column
            AlertOperator(AlertRules(idle_for_s=20)),  # short enough for idle alerts to open
            LatestSamplesOperator(10_000),
        ]
        rows: list[Any] = []
        for event in given:
            topic = GPU_SAMPLES if isinstance(event, SampleColumns) else TOPIC_OF[type(event)]
            for operator in (op for op in operators if topic in op.inputs):
                rows += [row for window in operator.advance(event) for row in window]
                # `latest` republishes a batch read by column as it was read: compared decoded
                rows += [r.batch() if isinstance(r, SampleColumns) else r for r in operator.process(event)]
        state = {
            op.name: sorted((key, repr(op.state.dump(key))) for key in op.state.live()) for op in operators
        }
        return rows, state

    models, by_column = run(list(events)), run(read)
    assert models == by_column
    assert any(isinstance(row, Alert) for row in models[0])
    assert any(isinstance(row, IdleGpuHours) and row.memory_idle_gpu_hours > 0 for row in models[0])


def test_a_string_length_past_any_position_is_refused_and_the_rest_of_the_fetch_read(
    codec: AvroCodec,
) -> None:
    batch = example_events("columns")[GPU_SAMPLES]
    values = [codec.encode(GPU_SAMPLES, batch.model_copy(update={"node": f"n{i}"})) for i in range(SMALLEST)]

    # event_id's length (one byte after the header): past the fetch, past what a position plus
    # it holds in int64, negative
    for length in (1 << 40, (1 << 63) - 1, -5):
        varint = bytearray()
        _long(varint, length)  # zigzag, as Avro writes a long
        bad = values[0][:5] + varint + values[0][6:]
        assert check(codec, [bad, *values]) == SMALLEST


def test_batches_of_one_node_share_its_names_across_fetches(codec: AvroCodec) -> None:
    """A worker holds many batches for event time; each batch of a node names the same cluster,
    source, node and GPUs, so they are one set of objects, not a copy per batch."""
    batch = example_events("columns")[GPU_SAMPLES]
    fetch = [codec.encode(GPU_SAMPLES, batch.model_copy(update={"node": f"n{i}"})) for i in range(SMALLEST)]
    decoder = NativeSampleDecoder(codec, GPU_SAMPLES)
    first, again = decoder.decode(fetch), decoder.decode(list(fetch))
    for one, other in zip(first, again, strict=True):
        assert one is not None and other is not None and one is not other
        assert other.device_ids is one.device_ids
        assert (other.cluster, other.source, other.node) == (one.cluster, one.source, one.node)
        assert other.node is one.node and other.source is one.source and other.cluster is one.cluster
    moved = batch.samples[1:] + batch.samples[:1]  # n0's GPUs, in another order
    changed = [
        codec.encode(GPU_SAMPLES, batch.model_copy(update={"node": "n0", "samples": moved})),
        *fetch[1:],
    ]
    read = decoder.decode(changed)[0]
    assert read is not None and read.device_ids == [sample.device_id for sample in moved]
    assert check(codec, changed) == SMALLEST


def test_the_names_kept_to_share_are_bounded_whatever_nodes_the_records_name(codec: AvroCodec) -> None:
    batch = example_events("columns")[GPU_SAMPLES]
    wire = codec.encode(GPU_SAMPLES, batch.model_copy(update={"node": "n" * 12}))
    at = wire.index(b"n" * 12)
    made_up = [wire[:at] + f"n{i:011d}".encode() + wire[at + 12 :] for i in range(120_000)]
    decoder = NativeSampleDecoder(codec, GPU_SAMPLES)
    first = decoder.decode(made_up[:1_000])[0]
    for start in range(0, len(made_up), 10_000):
        assert None not in decoder.decode(made_up[start : start + 10_000])
    again = decoder.decode(made_up[:1_000])[0]
    assert first is not None and again is not None
    assert again.device_ids == first.device_ids and again.device_ids is not first.device_ids  # forgotten
