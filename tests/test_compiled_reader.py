"""The generated Avro readers read exactly what fastavro + pydantic read, or refuse.

The reference here is the exact path, computed independently: ``fastavro.schemaless_reader``
over the committed schema, then ``model_validate``. Records come from a random generator
that walks each committed schema (every branch of every union, empty and long strings,
non-ASCII, large and negative longs, timestamps far from now, empty and multi-block arrays)
and from the example record of every producer topic, damaged byte by byte.
"""

from __future__ import annotations

import io
import json
import math
import random
import string
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

import fastavro
import pytest
from avro_damage import damaged

from gpulens.schemas.model.avro_schema import committed
from gpulens.schemas.model.exceptions import DecodeError, DecodeFailure
from gpulens.schemas.model.models import EARLIEST, LATEST, GpuSampleBatch, PodEvent, Record
from gpulens.schemas.model.topics import CATALOG, GPU_SAMPLES, PODS
from gpulens.schemas.wire.codec import AvroCodec
from gpulens.schemas.wire.compiled_reader import NotCompiled, compile_reader
from gpulens.testing.examples import example_events

MODELS = sorted({spec.record for spec in CATALOG}, key=lambda model: model.__name__)
_TEXT = string.ascii_letters + string.digits + "-_./:"
ms = timedelta(milliseconds=1)


@cache
def schema_of(model: type[Record]) -> Any:
    return fastavro.parse_schema(json.loads(committed(model)))


def write(model: type[Record], values: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema_of(model), values)
    return buf.getvalue()


def exact(model: type[Record], body: bytes) -> Record | None:
    """What the exact path makes of ``body``: the validated record, or None when it refuses."""
    buf = io.BytesIO(body)
    try:
        values = fastavro.schemaless_reader(buf, schema_of(model), None)
        if buf.tell() != len(body):
            return None
        return model.model_validate(values)
    except Exception:  # whatever fastavro or pydantic refuse
        return None


reader_of = cache(compile_reader)


def compiled(model: type[Record], body: bytes) -> Record | None:
    try:
        return reader_of(model)(body, 0)
    except Exception:
        return None


class RandomRecords:
    """Random values of an Avro schema, valid for Avro, not always for the model's constraints."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.named: dict[str, Any] = {}

    def value(self, schema: Any) -> Any:
        rng = self.rng
        if isinstance(schema, list):
            return self.value(rng.choice(schema))
        if isinstance(schema, str):
            return self._primitive(schema) if schema not in self.named else self.value(self.named[schema])
        kind = schema["type"]
        if kind == "record":
            self.named[f"{schema.get('namespace', '')}.{schema['name']}".lstrip(".")] = schema
            return {f["name"]: self.value(f["type"]) for f in schema["fields"]}
        if kind == "enum":
            self.named[f"{schema.get('namespace', '')}.{schema['name']}".lstrip(".")] = schema
            return rng.choice(schema["symbols"])
        if kind == "array":
            return [self.value(schema["items"]) for _ in range(rng.choice((0, 1, 2, 5)))]
        if kind == "map":
            return {self._string(): self.value(schema["values"]) for _ in range(rng.choice((0, 1, 3)))}
        if schema.get("logicalType") == "timestamp-millis":
            if rng.random() < 0.1:  # the model's bounds, either side, or far outside them
                edge = rng.choice((EARLIEST, LATEST)) + rng.choice((-1, 0, 1)) * timedelta(milliseconds=1)
                return rng.choice((edge, datetime(1971, 1, 1, tzinfo=UTC), datetime(2200, 1, 1, tzinfo=UTC)))
            return EARLIEST + timedelta(milliseconds=rng.randrange(0, int((LATEST - EARLIEST) / ms)))
        return self._primitive(kind)

    def _primitive(self, kind: str) -> Any:
        rng = self.rng
        if kind == "null":
            return None
        if kind == "string":
            return self._string()
        if kind == "bytes":
            return self._string().encode() + bytes([rng.randrange(256)])
        if kind == "boolean":
            return rng.random() < 0.5
        if kind in ("long", "int"):
            return rng.choice(
                (0, 1, -1, 63, -64, 64, 2**31, -(2**40), 2**63 - 1, -(2**63), rng.randrange(-999, 999))
            )
        if kind in ("double", "float"):
            edges = (0.0, -0.0, 1.5, 100.0, 100.5, -2.25, 1e300, -1e-300, math.inf, -math.inf, math.nan)
            return rng.choice((*edges, rng.uniform(-1e6, 1e6), rng.uniform(0, 100), rng.uniform(0, 100)))
        raise AssertionError(f"no random {kind}")

    def _string(self) -> str:
        rng = self.rng
        length = rng.choice((0, 1, 5, 64, 200))
        text = "".join(rng.choice(_TEXT) for _ in range(length))
        return text + ("µs→GPU" if rng.random() < 0.2 else "")


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_catalog_record_has_a_generated_reader(model: type[Record]) -> None:
    try:
        compile_reader(model)
    except NotCompiled as err:
        pytest.fail(f"every {model.__name__} would take the exact path: {err}")


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_random_records_read_as_the_exact_path_reads_them(model: type[Record]) -> None:
    records = RandomRecords(random.Random(model.__name__))
    schema = json.loads(committed(model))
    outcomes = {"read": 0, "refused": 0}
    for _ in range(300):
        body = write(model, records.value(schema))
        expected, got = exact(model, body), compiled(model, body)
        assert got == expected, body.hex()
        outcomes["read" if got is not None else "refused"] += 1
    assert outcomes["read"] > 0  # the generator reaches valid records of every model


@pytest.mark.parametrize("spec", list(example_events()), ids=lambda s: s.name)
def test_damaged_bodies_are_read_exactly_or_refused(spec: Any) -> None:
    body = write(spec.record, example_events("reader")[spec].model_dump())
    read = 0
    for candidate in damaged(body, random.Random(spec.name), header=0):
        got = compiled(spec.record, candidate)
        if got is not None:
            read += 1
            assert got == exact(spec.record, candidate), candidate.hex()
    assert read > 0


def test_a_record_breaking_a_model_constraint_still_gets_pydantics_reason(codec: AvroCodec) -> None:
    batch = example_events("reader")[GPU_SAMPLES]
    wire = codec.encode_dict(GPU_SAMPLES, {**batch.model_dump(), "node": ""})
    with pytest.raises(DecodeError) as refused:
        codec.decode(GPU_SAMPLES, wire)
    assert refused.value.reason is DecodeFailure.INVALID_RECORD
    assert refused.value.detail.startswith("GpuSampleBatch.node: String should have at least 1 character")


def test_the_codec_reads_producer_records_through_the_generated_reader(codec: AvroCodec) -> None:
    for spec, record in example_events("reader").items():
        decoded = codec.decode(spec, codec.encode(spec, record))
        assert decoded == record
        assert type(decoded) is type(record)


def test_a_negative_gpu_amount_is_refused_like_pydantic_refuses_it() -> None:
    pod = example_events("reader")[PODS]
    body = write(PodEvent, {**pod.model_dump(), "gpu_amount": -1.0})
    assert compiled(PodEvent, body) is None
    assert exact(PodEvent, body) is None


def test_a_sample_batch_reads_to_the_same_nested_models() -> None:
    batch = example_events("reader")[GPU_SAMPLES]
    got = compiled(GpuSampleBatch, write(GpuSampleBatch, batch.model_dump()))
    assert got == batch
    assert got is not None and got.samples[0] == batch.samples[0]
    assert got.model_dump_json() == batch.model_dump_json()
    assert got.model_fields_set == batch.model_fields_set


def test_records_read_hold_every_field_as_set_and_copies_do_not_reach_other_records(codec: AvroCodec) -> None:
    """Every record read has all its fields set, as the exact path's has; they share that set
    (a set per record and nested model was a third of their memory), and a copy with an update
    has its own, so no record changes another's."""
    for spec, record in example_events("reader").items():
        wire = codec.encode(spec, record)
        one, other = codec.decode(spec, wire), codec.decode(spec, wire)
        validated = exact(type(record), wire[5:])
        assert validated is not None
        assert one.model_fields_set == set(type(record).model_fields) == validated.model_fields_set
        assert other.model_fields_set is one.model_fields_set
        copy = one.model_copy(update={"event_id": "f" * 32})
        copy.model_fields_set.add("made-up")
        assert "made-up" not in one.model_fields_set
        assert one.model_dump(exclude_unset=True) == validated.model_dump(exclude_unset=True)
        assert one == other == record
