"""The workloads job: workload states from the watcher's workload events and forwarded pods.

Both inputs are keyed by workload and hashed alike, so a workload's state, its internal
record (the watcher's status, its active pods) and the last forwarded copy applied per pods
partition all live in the partition of the event. A forwarded copy at or before the last
one applied from its pods partition is one the forwarder sent again after a restart: it
changes nothing and publishes nothing.
"""

from __future__ import annotations

from faust.types import EventT

from gpulens.pipeline.entity_tables.app import Tables, source
from gpulens.pipeline.entity_tables.decoding import Decoding
from gpulens.pipeline.entity_tables.exactly_once import IncarnationApp
from gpulens.pipeline.entity_tables.forwarding import POSITION, Position
from gpulens.pipeline.entity_tables.state_codec import WorkloadTable
from gpulens.pipeline.entity_tables.writing import StateWriter
from gpulens.pipeline.state_tables import StateTables, workload_chain
from gpulens.schemas.model.models import PodEvent, WorkloadEvent
from gpulens.schemas.model.topics import PODS, WORKLOADS, TopicSpec, entity_key


def _position(event: EventT[bytes]) -> Position:
    headers = dict(event.message.headers or ())
    found = headers.get(POSITION)
    assert isinstance(found, bytes), f"a forwarded pod without {POSITION}"
    return Position.parse(found)


def register(
    app: IncarnationApp, tables: Tables, decoding: Decoding, writer: StateWriter, forwarded: TopicSpec
) -> None:
    """Add the workloads agent to ``app``."""
    state = StateTables(WorkloadTable(tables.workload_records))

    async def apply(event: EventT[bytes]) -> None:
        if event.message.topic == WORKLOADS.name:
            workload = await decoding.decode(WORKLOADS, event, WorkloadEvent)
            if workload is not None:
                writer.apply(state.workload_event(workload))
            return
        position = _position(event)
        applied_key = f"{event.message.partition}/{position.partition}".encode()
        applied = tables.forwarded.get(applied_key)
        if applied is not None and position <= Position.parse(applied):
            return
        pod = await decoding.decode(PODS, event, PodEvent)
        if pod is not None:
            owners = [entity_key(pod.cluster, owner.uid) for owner in workload_chain(pod)]
            key = event.message.key
            assert isinstance(key, bytes), "a forwarded pod without its workload's key"
            writer.apply(state.pod_in_workload(pod, owners.index(key)))
        tables.forwarded[applied_key] = position.header()

    app.agent(source(app, WORKLOADS, forwarded), name="gpulens.tables.workloads")(app.agent_body(apply))
