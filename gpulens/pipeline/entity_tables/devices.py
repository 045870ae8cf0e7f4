"""The devices job: each node's inventory into its table, and the device changelog.

The changes are the diff between the inventory in the table and the one arriving
(gpulens.pipeline.device_changes), written to a table whose changelog is gpulens.changelog.devices.v1
(the newest change per node), in the transaction that commits the inventory.
"""

from __future__ import annotations

from faust.types import EventT

from gpulens.pipeline.device_changes import diff
from gpulens.pipeline.entity_tables.app import Tables, source
from gpulens.pipeline.entity_tables.decoding import Decoding
from gpulens.pipeline.entity_tables.exactly_once import IncarnationApp
from gpulens.pipeline.entity_tables.writing import StateWriter
from gpulens.pipeline.state_tables import entity_rows
from gpulens.schemas.model.models import DeviceInventory
from gpulens.schemas.model.topics import DEVICE_CHANGELOG, DEVICE_INVENTORY, STATE_INVENTORY, record_key
from gpulens.schemas.wire.codec import AvroCodec


def register(
    app: IncarnationApp, tables: Tables, codec: AvroCodec, decoding: Decoding, writer: StateWriter
) -> None:
    """Add the inventories agent to ``app``."""

    async def inventory(event: EventT[bytes]) -> None:
        found = await decoding.decode(DEVICE_INVENTORY, event, DeviceInventory)
        if found is None:
            return
        known = tables.inventories.get(record_key(STATE_INVENTORY, found))
        before = codec.decode(STATE_INVENTORY, known, DeviceInventory) if known is not None else None
        for change in diff(before, found):
            tables.device_changes[record_key(DEVICE_CHANGELOG, change)] = codec.encode(
                DEVICE_CHANGELOG, change
            )
        writer.apply(entity_rows(found))

    app.agent(source(app, DEVICE_INVENTORY), name="gpulens.tables.inventories")(app.agent_body(inventory))
