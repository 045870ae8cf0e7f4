"""Table layouts: the rows a record becomes follow the columns its layout lists, value for
value; the migrations agree with the layouts column for column (test_sink_migrations)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from enum import Enum

import pytest

from gpulens.consumers.clickhouse.layouts import VERSION, Layout, items
from gpulens.consumers.clickhouse.rows import LAYOUTS, rows_of
from gpulens.schemas.kafka.consuming import Decoded
from gpulens.schemas.model.models import ChangeType, GpuSampleBatch, NodeEvent
from gpulens.schemas.model.topics import GPU_SAMPLES, NODES, STORAGE
from gpulens.testing.examples import example_events

AT = datetime(2026, 11, 1, 12, 0, 0, 250_000, tzinfo=UTC)


def test_a_layout_takes_attributes_computed_values_items_and_the_version_in_column_order() -> None:
    batch = example_events("c", at=AT)[GPU_SAMPLES]
    assert isinstance(batch, GpuSampleBatch) and len(batch.samples) == 2
    layout = Layout(
        GpuSampleBatch,
        "t",
        ("host", "node"),
        *items(("gpu", "index"), "device_id"),
        ("gpus", lambda b: len(b.samples)),
        VERSION,
        "cluster",
        each=lambda b: reversed(b.samples),
    )
    version = (int(AT.timestamp() * 1000) << 64) | 7  # event time in ms, then the offset

    assert layout.tables[0].columns == ("host", "gpu", "device_id", "gpus", "version", "cluster")
    assert [row for _, row in layout.pairs(batch, 7)] == [
        (batch.node, s.index, s.device_id, 2, version, "c") for s in reversed(batch.samples)
    ]


def test_state_and_history_tables_get_the_same_row() -> None:
    node = example_events("c", at=AT)[NODES]
    assert isinstance(node, NodeEvent)
    layout = Layout(NodeEvent, ("state", "history"), ("type", "type.value"), "node")

    assert [(table.name, row) for table, row in layout.pairs(node, 0)] == [
        ("state", (ChangeType.ADDED.value, node.node)),
        ("history", (ChangeType.ADDED.value, node.node)),
    ]


TRANSFORMED = {"taints", "addresses", "conditions", "containers", "owners", "devices", "version"}
"""Columns named after a field that hold something else: nested records as tuples, and the
state version (a workload's ``version`` field is its ``api_version`` column)."""


def test_every_column_named_after_a_field_of_its_record_carries_that_field() -> None:
    """Where a column has its field's name, the row holds the field's value (an enum's value)
    at the column's place: the values are put in the order the layout lists the columns."""
    examples = {type(e): e for spec, e in example_events("c", at=AT).items() if spec is not STORAGE}
    checked = 0
    for layout in LAYOUTS:
        record = examples.get(layout.record)
        if record is None:  # aggregates, dead letters, derived records: test_sink_rows stores them
            continue
        shared = type(record).model_fields.keys() & set(layout.tables[0].columns) - TRANSFORMED
        for table, row in rows_of(Decoded("t", 0, 3, None, record)):
            if table not in layout.tables:
                continue
            assert len(row) == len(table.columns), table.name
            values = dict(zip(table.columns, row, strict=True))
            for column in shared:
                field = getattr(record, column)
                assert values[column] == (field.value if isinstance(field, Enum) else field), (
                    table.name,
                    column,
                )
                checked += 1
    assert checked > 100


@pytest.mark.parametrize(
    ("columns", "each", "refused"),
    [
        ((("x", "node; import os"),), None, "is not an attribute path"),
        ((*items("index"),), None, "Item columns need each="),
    ],
)
def test_a_layout_refuses_what_it_cannot_compile(columns, each, refused) -> None:
    with pytest.raises(ValueError, match=refused):
        Layout(GpuSampleBatch, "t", *columns, each=each)


def test_a_layout_with_items_makes_rows_of_one_table() -> None:
    with pytest.raises(ValueError, match="one table"):
        Layout(GpuSampleBatch, ("a", "b"), *items("index"), each=lambda b: b.samples)


def test_a_record_without_items_makes_no_item_rows() -> None:
    batch = example_events("c", at=AT - timedelta(hours=1))[GPU_SAMPLES].model_copy(update={"samples": []})
    assert rows_of(Decoded("t", 0, 0, None, batch)) == []
