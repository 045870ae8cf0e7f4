"""The generated Avro writers write exactly what fastavro writes from ``model_dump``.

The reference is the path the codec took before: ``fastavro.schemaless_writer`` over the
committed schema and the record's ``model_dump()``. Records are the valid ones among the
reader test's random records of every committed schema (every union branch, empty and long
strings, non-ASCII, extreme longs and doubles, NaN, timestamps at the models' bounds), and a
record the writer cannot write (built without validation) still gets the reference's bytes
through the codec.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime

import pytest
from test_compiled_reader import MODELS, RandomRecords, exact, write

from gpulens.schemas.model.avro_schema import committed
from gpulens.schemas.model.models import ChangeType, DeviceChange, DeviceKind, Record
from gpulens.schemas.model.topics import PODS
from gpulens.schemas.wire.codec import AvroCodec
from gpulens.schemas.wire.compiled_reader import NotCompiled
from gpulens.schemas.wire.compiled_writer import compile_writer
from gpulens.testing.examples import example_events


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_catalog_record_has_a_generated_writer(model: type[Record]) -> None:
    try:
        compile_writer(model)
    except NotCompiled as err:
        pytest.fail(f"every {model.__name__} would be written the exact way: {err}")


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_random_records_are_written_as_fastavro_writes_their_model_dump(model: type[Record]) -> None:
    writer = compile_writer(model)
    records = RandomRecords(random.Random(f"writer-{model.__name__}"))
    schema = json.loads(committed(model))
    written = 0
    for _ in range(300):
        record = exact(model, write(model, records.value(schema)))
        if record is None:
            continue  # not a valid record of the model: never written
        assert writer(record) == write(model, record.model_dump()), record
        written += 1
    assert written > 0


def test_a_record_the_writer_cannot_write_gets_the_exact_paths_bytes(codec: AvroCodec) -> None:
    pod = example_events("writer")[PODS]
    naive = type(pod).model_construct(**{**dict(pod), "event_time": datetime(2026, 11, 1, 12, 0)})
    with pytest.raises(TypeError):
        compile_writer(type(pod))(naive)
    assert codec.encode(PODS, naive) == codec.encode_dict(PODS, naive.model_dump())
    assert codec.decode(PODS, codec.encode(PODS, pod)) == pod


@pytest.mark.parametrize("size", [0, 1, 63, 64, 65, 127, 128, 8191, 8192])
def test_lengths_and_counts_on_either_side_of_one_varint_byte_are_written_as_fastavro_writes_them(
    size: int,
) -> None:
    # The writer appends a length or count under 64 as one byte itself, and calls the varint
    # writer from 64 on: both sides of that edge, and of the next byte's, for strings, lists and maps.
    names = [f"f{i}" for i in range(size)]
    record = DeviceChange(
        event_id="e" * size,
        cluster="c",
        event_time=datetime(2026, 11, 30, tzinfo=UTC),
        source="s",
        node="n",
        change=ChangeType.MODIFIED,
        device_kind=DeviceKind.RDMA,
        device_id="x" * size,
        changed=names,
        before=dict.fromkeys(names, "é" * size),
        after=dict.fromkeys(names, ""),
    )
    assert compile_writer(DeviceChange)(record) == write(DeviceChange, record.model_dump())
