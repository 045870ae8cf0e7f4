"""Primus-Lens's ``ExporterService.StreamContainerEvents`` on the gateway: Lens's container events
as GPULens ContainerEvents.

A Lens node exporter streams one ``exporter.ContainerEvent`` per change of a container: its
``type`` is the status it reports (``Created``, ``Running``, ``Exit``, ``Deleted``,
``OOMKilled``; ``snapshot`` and ``update`` carry it in ``data.status``) and ``data`` its
container document (the CRI ContainerStatus fields, ``pod_*``, ``devices``, ``oom_killed``,
``exit_time``). :func:`container_event` maps one to the ContainerEvent it means; the service
publishes each through the Ingest service's own path (validated, produced idempotently,
acknowledged), so a Lens exporter and a GPULens agent publish the same records.

Lens names a container's devices from the OCI device list of its spec, not from a device
plugin: its GPUs become devices of kind GPU under the resource name ``primus-lens/gpu``, its
InfiniBand ports of kind RDMA under ``primus-lens/infiniband``, each by its serial (else UUID,
else PCI slot), a name the node's inventory knows as an alias.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from typing import Any

import grpc
from google.protobuf import json_format

from gpulens.producers.gateway.exceptions import GatewayError
from gpulens.producers.gateway.metrics import GatewayMetrics
from gpulens.producers.gateway.serving import IngestService, abort
from gpulens.protos.gateway.v1 import ingest_pb2
from gpulens.protos.lens.v1 import exporter_pb2, exporter_pb2_grpc
from gpulens.schemas.model.ids import event_id
from gpulens.schemas.model.models import (
    EARLIEST,
    LATEST,
    ChangeType,
    ContainerEvent,
    ContainerRuntimeState,
    DeviceAssignment,
    DeviceKind,
)
from gpulens.schemas.model.topics import CONTAINERS, TopicSpec, record_key
from gpulens.schemas.wire.codec import AvroCodec

log = logging.getLogger(__name__)

SOURCE = "primus-lens-exporter"
"""``source`` of the records made from Lens's events."""

PUBLISHED_METADATA, SKIPPED_METADATA = "gpulens-published", "gpulens-skipped"
"""Trailing metadata of a call that ended OK: how many of its events were published, skipped."""

_STATES: dict[str, ContainerRuntimeState] = {
    "created": ContainerRuntimeState.CREATED,
    "create": ContainerRuntimeState.CREATED,
    "task_create": ContainerRuntimeState.CREATED,
    "running": ContainerRuntimeState.RUNNING,
    "task_start": ContainerRuntimeState.RUNNING,
    "restart": ContainerRuntimeState.RUNNING,
    "exit": ContainerRuntimeState.EXITED,
    "task_stop": ContainerRuntimeState.EXITED,
    "dead": ContainerRuntimeState.EXITED,
    "deleted": ContainerRuntimeState.DELETED,
    "delete": ContainerRuntimeState.DELETED,
    "task_deleted": ContainerRuntimeState.DELETED,
}
"""Lens's statuses (core/pkg/constant) and event types (core/pkg/model/containerd.go), lower-cased."""
_OOM = ("oomkilled",)
_STATUS_IN_DATA = ("snapshot", "update")

_DEVICES = (
    ("gpu", "primus-lens/gpu", DeviceKind.GPU),
    ("infiniband", "primus-lens/infiniband", DeviceKind.RDMA),
)


def _time(value: Any) -> datetime | None:
    """An RFC 3339 time of Go's encoding/json, None for its zero time and anything unusable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None or not EARLIEST <= parsed < LATEST:
        return None
    return parsed


def _devices(data: Mapping[str, Any]) -> list[DeviceAssignment]:
    found = data.get("devices") or {}
    devices = []
    for group, resource, kind in _DEVICES:
        for device in found.get(group) or ():
            name = device.get("serial") or device.get("uuid") or device.get("slot")
            if name:
                devices.append(DeviceAssignment(resource_name=resource, device_id=str(name), kind=kind))
    return devices


def container_event(
    lens: exporter_pb2.ContainerEvent, *, cluster: str, received: datetime
) -> ContainerEvent | None:
    """The ContainerEvent a Lens event means; None when it says nothing GPULens can place (no
    container id or node, not a pod's container, an unknown type)."""
    data: dict[str, Any] = json_format.MessageToDict(lens.data)
    kind = lens.type.lower()
    status = str(data.get("status", "")).lower() if kind in _STATUS_IN_DATA else kind
    oom = bool(data.get("oom_killed")) or status in _OOM
    state = _STATES.get(status)
    if status in _OOM:
        state = ContainerRuntimeState.EXITED if data.get("exit_code") else ContainerRuntimeState.RUNNING
    labels = data.get("labels") or {}
    name = (data.get("metadata") or {}).get("name") or labels.get("io.kubernetes.container.name")
    namespace, pod = data.get("pod_namespace"), data.get("pod_name")
    if state is None or not (lens.container_id and lens.node and name and namespace and pod):
        return None
    finished = state in (ContainerRuntimeState.EXITED, ContainerRuntimeState.DELETED)
    at = _time(data.get("last_updated")) or received
    return ContainerEvent(
        event_id=event_id(cluster, lens.node, lens.container_id, lens.type, state, at.isoformat()),
        cluster=cluster,
        event_time=at,
        source=SOURCE,
        type={
            ContainerRuntimeState.CREATED: ChangeType.ADDED,
            ContainerRuntimeState.DELETED: ChangeType.DELETED,
        }.get(state, ChangeType.MODIFIED),
        node=lens.node,
        pod_uid=data.get("pod_uuid") or None,
        pod_namespace=namespace,
        pod_name=pod,
        container_name=name,
        container_id=lens.container_id,
        devices=[] if state is ContainerRuntimeState.DELETED else _devices(data),
        state=state,
        # Go leaves a zero exit code out of its JSON: a finished container without one exited 0
        exit_code=int(data.get("exit_code", 0)) if finished else None,
        exited_at=_time(data.get("exit_time")) if finished else None,
        oom_killed=oom,
    )


class ExporterService(exporter_pb2_grpc.ExporterServiceServicer):
    """``exporter.ExporterService``: Lens's container events, published as ContainerEvents."""

    def __init__(
        self,
        ingest: IngestService,
        codec: AvroCodec,
        metrics: GatewayMetrics,
        *,
        cluster: str,
        topic: TopicSpec = CONTAINERS,
    ) -> None:
        self._ingest = ingest
        self._codec = codec
        self._metrics = metrics
        self._cluster = cluster
        self._topic = topic

    async def StreamContainerEvents(
        self, request_iterator: AsyncIterator[exporter_pb2.ContainerEvent], context: grpc.aio.ServicerContext
    ) -> None:
        """Publish the call's events as they come; end once the broker has every one of them."""
        await self._ingest.authenticate(context)
        accepted, skipped = [], 0
        try:
            async for lens in request_iterator:
                event = container_event(lens, cluster=self._cluster, received=datetime.now(UTC))
                if event is None:
                    skipped += 1
                    self._metrics.container_events.labels("skipped").inc()
                    log.debug("Lens event %r of container %r skipped", lens.type, lens.container_id)
                    continue
                record = ingest_pb2.Event(
                    topic=self._topic.name,
                    key=record_key(self._topic, event),
                    value=self._codec.encode(self._topic, event),
                )
                batch = ingest_pb2.EventBatch(batch_id=f"lens-{uuid.uuid4().hex}", events=[record])
                accepted.append(await self._ingest.accept(batch))
            deadline = time.monotonic() + self._ingest.ack_timeout_s
            for item in accepted:
                await self._ingest.acknowledged(item, deadline - time.monotonic())
        except GatewayError as err:
            await abort(context, err)
        self._metrics.container_events.labels("published").inc(len(accepted))
        context.set_trailing_metadata(
            ((PUBLISHED_METADATA, str(len(accepted))), (SKIPPED_METADATA, str(skipped)))
        )
