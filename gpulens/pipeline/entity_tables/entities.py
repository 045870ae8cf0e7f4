"""The entity jobs: pods, nodes and containers into their tables, pods on to their workloads.

Each source topic has the partition count of its table's changelog, so every write lands in
the partition of the event that caused it, in the transaction that commits the event.
"""

from __future__ import annotations

from faust.types import EventT

from gpulens.pipeline.entity_tables.app import source
from gpulens.pipeline.entity_tables.decoding import Decoding
from gpulens.pipeline.entity_tables.exactly_once import IncarnationApp
from gpulens.pipeline.entity_tables.forwarding import PodForwarder
from gpulens.pipeline.entity_tables.writing import StateWriter
from gpulens.pipeline.state_tables import entity_rows
from gpulens.schemas.model.models import ContainerEvent, NodeEvent, PodEvent
from gpulens.schemas.model.topics import CONTAINERS, NODES, PODS


def register(app: IncarnationApp, decoding: Decoding, writer: StateWriter, forwarder: PodForwarder) -> None:
    """Add the pods, nodes and containers agents to ``app``."""

    async def pod(event: EventT[bytes]) -> None:
        found = await decoding.decode(PODS, event, PodEvent)
        if found is None:
            return
        writer.apply(entity_rows(found))
        value = event.message.value
        assert isinstance(value, bytes)
        await forwarder.forward(found, value, event.message.partition, event.message.offset)

    async def node(event: EventT[bytes]) -> None:
        found = await decoding.decode(NODES, event, NodeEvent)
        if found is not None:
            writer.apply(entity_rows(found))

    async def container(event: EventT[bytes]) -> None:
        found = await decoding.decode(CONTAINERS, event, ContainerEvent)
        if found is not None:
            writer.apply(entity_rows(found))

    for spec, name, apply in (
        (PODS, "pods", pod),
        (NODES, "nodes", node),
        (CONTAINERS, "containers", container),
    ):
        app.agent(source(app, spec), name=f"gpulens.tables.{name}")(app.agent_body(apply))
