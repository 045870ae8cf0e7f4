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
from typing import Any

from avro_damage import damaged
from test_compiled_reader import RandomRecords, exact

from schemas.avro_schema import committed
from schemas.codec import AvroCodec
from schemas.examples import example_events
from schemas.models import GpuSampleBatch
from schemas.sample_columns import SMALLEST, NativeSampleDecoder, SampleColumns, readings
from schemas.topics import GPU_SAMPLES, PODS


def same(columns: SampleColumns, record: GpuSampleBatch) -> bool:
    fields = ("event_id", "cluster", "event_time", "source", "node")
    return [getattr(columns, f) for f in fields] == [getattr(record, f) for f in fields] and list(
        readings(columns)
    ) == list(readings(record))


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
