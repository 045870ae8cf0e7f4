"""HTTP views of the current state of one entity (faust's web server, JSON, 404 if unknown).

    GET /pods/{cluster}/{uid}         the pod's newest state
    GET /workloads/{cluster}/{uid}    the workload, its active pods and its child workloads
    GET /nodes/{cluster}/{node}       the node and its device inventory

They read this process's stores (its active and standby partitions): with several processes,
ask each, or the one that owns the entity's partition.
"""

from __future__ import annotations

from typing import Any

import faust
from faust.web import Request, Response, View

from gpulens.pipeline.entity_tables.app import Tables
from gpulens.pipeline.entity_tables.state_codec import load_workload
from gpulens.schemas.model.topics import (
    STATE_INVENTORY,
    STATE_NODES,
    STATE_PODS,
    STATE_WORKLOADS,
    TopicSpec,
    entity_key,
)
from gpulens.schemas.wire.codec import AvroCodec


def register(app: faust.App, tables: Tables, codec: AvroCodec) -> None:
    """Add the views to ``app``'s web server."""

    def state(spec: TopicSpec, table: Any, cluster: str, entity: str) -> dict[str, Any] | None:
        value = table.get(entity_key(cluster, entity))
        return None if value is None else codec.decode(spec, value).model_dump(mode="json")

    @app.page("/pods/{cluster}/{uid}")
    class PodView(View):
        async def get(self, request: Request, cluster: str, uid: str) -> Response:
            pod = state(STATE_PODS, tables.pods, cluster, uid)
            return self.notfound(f"no pod {cluster}/{uid}") if pod is None else self.json(pod)

    @app.page("/workloads/{cluster}/{uid}")
    class WorkloadView(View):
        async def get(self, request: Request, cluster: str, uid: str) -> Response:
            workload = state(STATE_WORKLOADS, tables.workloads, cluster, uid)
            if workload is None:
                return self.notfound(f"no workload {cluster}/{uid}")
            record = tables.workload_records.get(entity_key(cluster, uid))
            pods = sorted(load_workload(record).pods) if record is not None else []
            prefix = f"{cluster}/".encode()
            children = [
                child
                for key, value in tables.workload_records.items()
                if key.startswith(prefix) and load_workload(value).parent_uid == uid
                if (child := state(STATE_WORKLOADS, tables.workloads, cluster, key[len(prefix) :].decode()))
            ]
            return self.json({"workload": workload, "pods": pods, "children": children})

    @app.page("/nodes/{cluster}/{node}")
    class NodeView(View):
        async def get(self, request: Request, cluster: str, node: str) -> Response:
            found = state(STATE_NODES, tables.nodes, cluster, node)
            if found is None:
                return self.notfound(f"no node {cluster}/{node}")
            devices = state(STATE_INVENTORY, tables.inventories, cluster, node)
            return self.json({"node": found, "devices": devices})
