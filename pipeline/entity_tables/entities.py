"""The entity jobs: pods, nodes and containers into their tables, pods on to their workloads.

Each source topic has the partition count of its table's changelog, so every write lands in
the partition of the event that caused it, in the transaction that commits the event.
"""

from __future__ import annotations

import faust
from faust.types import StreamT

from pipeline.entity_tables.app import source
from pipeline.entity_tables.decoding import Decoding
from pipeline.entity_tables.forwarding import PodForwarder
from pipeline.entity_tables.writing import StateWriter
from pipeline.state_tables import entity_rows
from schemas.models import ContainerEvent, NodeEvent, PodEvent
from schemas.topics import CONTAINERS, NODES, PODS


def register(app: faust.App, decoding: Decoding, writer: StateWriter, forwarder: PodForwarder) -> None:
    """Add the pods, nodes and containers agents to ``app``."""

    @app.agent(source(app, PODS), name="gpulens.tables.pods")
    async def pods(stream: StreamT[bytes]) -> None:
        async for event in stream.events():
            pod = await decoding.decode(PODS, event, PodEvent)
            if pod is None:
                continue
            writer.apply(entity_rows(pod))
            value = event.message.value
            assert isinstance(value, bytes)
            await forwarder.forward(pod, value, event.message.partition, event.message.offset)

    @app.agent(source(app, NODES), name="gpulens.tables.nodes")
    async def nodes(stream: StreamT[bytes]) -> None:
        async for event in stream.events():
            node = await decoding.decode(NODES, event, NodeEvent)
            if node is not None:
                writer.apply(entity_rows(node))

    @app.agent(source(app, CONTAINERS), name="gpulens.tables.containers")
    async def containers(stream: StreamT[bytes]) -> None:
        async for event in stream.events():
            container = await decoding.decode(CONTAINERS, event, ContainerEvent)
            if container is not None:
                writer.apply(entity_rows(container))
