"""Putting state rows into the public tables: a record under its key, a tombstone as a delete.

A write is a changelog record of the table's public topic, so what StateTables says goes to
gpulens.state.*.v1 lands there in the same order, Avro-encoded under ``<topic>-value``.
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping

from gpulens.pipeline.entity_tables.app import Tables
from gpulens.pipeline.state_tables import STATE_TOPIC_OF, Tombstone
from gpulens.schemas.model.models import Record
from gpulens.schemas.model.topics import (
    STATE_CONTAINERS,
    STATE_INVENTORY,
    STATE_NODES,
    STATE_PODS,
    STATE_WORKLOADS,
    record_key,
)
from gpulens.schemas.wire.codec import AvroCodec


class StateWriter:
    """Applies StateTables rows to the app's public tables."""

    def __init__(self, codec: AvroCodec, tables: Tables) -> None:
        self._codec = codec
        self._tables: dict[str, MutableMapping[bytes, bytes]] = {
            STATE_PODS.name: tables.pods,
            STATE_NODES.name: tables.nodes,
            STATE_INVENTORY.name: tables.inventories,
            STATE_CONTAINERS.name: tables.containers,
            STATE_WORKLOADS.name: tables.workloads,
        }

    def apply(self, rows: Iterable[Record | Tombstone]) -> None:
        for row in rows:
            if isinstance(row, Tombstone):
                del self._tables[row.topic.name][row.key]
                continue
            spec = STATE_TOPIC_OF[type(row)]
            self._tables[spec.name][record_key(spec, row)] = self._codec.encode(spec, row)
