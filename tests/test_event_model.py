"""The event model: committed Avro schemas equal the models, and every record round-trips."""

from __future__ import annotations

import io
import json
import math
from datetime import UTC, datetime, timedelta, timezone

import fastavro
import pytest
from pydantic import ValidationError

from gpulens.schemas.model.avro_schema import committed, derive, render, schema_path
from gpulens.schemas.model.models import (
    EARLIEST,
    EVENT_TYPES,
    LATEST,
    ChangeType,
    DeadLetter,
    GpuSampleBatch,
    NodeEvent,
    PodEvent,
    Record,
)
from gpulens.schemas.model.topics import CATALOG, GPU_SAMPLES, PODS
from gpulens.testing.examples import example_events

ALL_RECORDS: tuple[type[Record], ...] = tuple(spec.record for spec in CATALOG)


@pytest.mark.parametrize("model", ALL_RECORDS, ids=lambda m: m.__name__)
def test_committed_schema_equals_the_model(model: type[Record]) -> None:
    assert schema_path(model).read_text() == render(derive(model))


@pytest.mark.parametrize("model", ALL_RECORDS, ids=lambda m: m.__name__)
def test_every_model_field_is_a_documented_avro_field(model: type[Record]) -> None:
    schema = json.loads(committed(model))
    assert schema["namespace"] == "io.gpulens.v1"
    assert [f["name"] for f in schema["fields"]] == list(model.model_fields)
    assert all(f.get("doc") for f in schema["fields"])


def test_every_event_type_and_the_dlq_have_a_topic() -> None:
    assert {*EVENT_TYPES, DeadLetter} <= {spec.record for spec in CATALOG}


@pytest.mark.parametrize("topic", list(example_events()), ids=lambda t: t.name)
def test_example_round_trips_through_avro(topic) -> None:
    event = example_events()[topic]
    schema = fastavro.parse_schema(json.loads(committed(topic.record)))
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema, event.model_dump())
    buf.seek(0)
    assert topic.record.model_validate(fastavro.schemaless_reader(buf, schema, schema)) == event


def test_times_are_normalised_to_utc_milliseconds() -> None:
    local = datetime(2026, 1, 2, 3, 4, 5, 678_901, tzinfo=timezone(timedelta(hours=8)))
    node = example_events()[CATALOG[0]].model_copy(update={})
    event = NodeEvent.model_validate({**node.model_dump(), "event_time": local})
    assert event.event_time == datetime(2026, 1, 1, 19, 4, 5, 678_000, tzinfo=UTC)


def test_naive_times_are_refused() -> None:
    pod = example_events()[PODS].model_dump()
    with pytest.raises(ValidationError, match="timezone"):
        PodEvent.model_validate({**pod, "creation_time": datetime(2026, 1, 1)})


def test_negative_gpu_amount_is_refused() -> None:
    pod = example_events()[PODS].model_dump()
    with pytest.raises(ValidationError, match="gpu_amount"):
        PodEvent.model_validate({**pod, "gpu_amount": -1.0})


def test_enums_have_a_default_symbol_for_forward_evolution() -> None:
    schema = json.loads(committed(PodEvent))
    change_type = next(f for f in schema["fields"] if f["name"] == "type")["type"]
    assert change_type["default"] == "MODIFIED"
    assert change_type["default"] in change_type["symbols"]


def test_holds_gpus_follows_the_design_definition() -> None:
    running = example_events()[PODS]
    assert running.holds_gpus
    assert not running.model_copy(update={"phase": "Succeeded"}).holds_gpus
    assert not running.model_copy(update={"node": None}).holds_gpus
    assert not running.model_copy(update={"type": ChangeType.DELETED}).holds_gpus


def _sample_with(**changes: object) -> dict[str, object]:
    batch = example_events()[GPU_SAMPLES].model_dump()
    return {**batch, "samples": [{**batch["samples"][0], **changes}]}


@pytest.mark.parametrize(
    ("record", "values", "field", "why"),
    [
        (
            GpuSampleBatch,
            _sample_with(utilization_pct=math.nan),
            "samples.0.utilization_pct",
            "finite number",
        ),
        (GpuSampleBatch, _sample_with(power_watts=math.inf), "samples.0.power_watts", "finite number"),
        (
            GpuSampleBatch,
            _sample_with(utilization_pct=-0.5),
            "samples.0.utilization_pct",
            "greater than or equal to 0",
        ),
        (
            GpuSampleBatch,
            _sample_with(utilization_pct=100.5),
            "samples.0.utilization_pct",
            "less than or equal to 100",
        ),
        (
            GpuSampleBatch,
            _sample_with(temperature_edge_c=-3.0),
            "samples.0.temperature_edge_c",
            "greater than or",
        ),
        (
            GpuSampleBatch,
            _sample_with(memory_used_bytes=-1),
            "samples.0.memory_used_bytes",
            "greater than or",
        ),
        (PodEvent, {"gpu_resources": {"amd.com/gpu": -1.0}}, "gpu_resources.amd.com/gpu", "greater than or"),
        (PodEvent, {"gpu_amount": math.inf}, "gpu_amount", "finite number"),
        (
            PodEvent,
            {"event_time": datetime(1970, 1, 1, tzinfo=UTC)},
            "event_time",
            "greater than or equal to 2000",
        ),
        (PodEvent, {"creation_time": datetime(2200, 1, 1, tzinfo=UTC)}, "creation_time", "less than 2100"),
        (NodeEvent, {"gpu_allocatable": {"amd.com/gpu": math.nan}}, "gpu_allocatable.amd.com/gpu", "finite"),
    ],
)
def test_values_breaking_the_documented_ranges_are_refused_naming_the_field(
    record: type[Record], values: dict[str, object], field: str, why: str
) -> None:
    topic = next(spec for spec in example_events() if spec.record is record)
    with pytest.raises(ValidationError) as refused:
        record.model_validate({**example_events()[topic].model_dump(), **values})
    [error] = refused.value.errors()
    assert ".".join(str(p) for p in error["loc"]) == field
    assert why in error["msg"]


def test_the_bounds_themselves_are_valid() -> None:
    batch = example_events()[GPU_SAMPLES]
    edge = {"utilization_pct": 100.0, "power_watts": 0.0, "temperature_edge_c": 0.0}
    assert (
        GpuSampleBatch.model_validate({**_sample_with(**edge), "event_time": EARLIEST}).event_time == EARLIEST
    )
    latest = LATEST - timedelta(milliseconds=1)
    assert GpuSampleBatch.model_validate({**batch.model_dump(), "event_time": latest}).event_time == latest
