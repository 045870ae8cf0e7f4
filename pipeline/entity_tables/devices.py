"""The devices job: each node's inventory into its table, and the device changelog.

The changes are the diff between the inventory in the table and the one arriving
(pipeline.device_changes), written to a table whose changelog is gpulens.changelog.devices.v1
(the newest change per node), in the transaction that commits the inventory.
"""

from __future__ import annotations

import faust
from faust.types import StreamT

from pipeline.device_changes import diff
from pipeline.entity_tables.app import Tables, source
from pipeline.entity_tables.decoding import Decoding
from pipeline.entity_tables.writing import StateWriter
from pipeline.state_tables import entity_rows
from schemas.codec import AvroCodec
from schemas.models import DeviceInventory
from schemas.topics import DEVICE_CHANGELOG, DEVICE_INVENTORY, STATE_INVENTORY, record_key


def register(
    app: faust.App, tables: Tables, codec: AvroCodec, decoding: Decoding, writer: StateWriter
) -> None:
    """Add the inventories agent to ``app``."""

    @app.agent(source(app, DEVICE_INVENTORY), name="gpulens.tables.inventories")
    async def inventories(stream: StreamT[bytes]) -> None:
        async for event in stream.events():
            inventory = await decoding.decode(DEVICE_INVENTORY, event, DeviceInventory)
            if inventory is None:
                continue
            known = tables.inventories.get(record_key(STATE_INVENTORY, inventory))
            before = codec.decode(STATE_INVENTORY, known) if known is not None else None
            for change in diff(before, inventory):
                tables.device_changes[record_key(DEVICE_CHANGELOG, change)] = codec.encode(
                    DEVICE_CHANGELOG, change
                )
            writer.apply(entity_rows(inventory))
