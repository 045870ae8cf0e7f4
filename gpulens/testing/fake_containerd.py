"""A containerd for tests: its real gRPC services on a unix socket, serving a recorded event stream.

``Events/Subscribe`` and ``Containers/Get`` are served with the generated servicers of
containerd's own API (gpulens/protos/containerd/) from transcripts in the tools' formats: the
event stream as ``ctr events`` prints it and each container as ``ctr containers info`` prints
it (tests/fixtures/: containerd_events_captured.txt is real output, containerd_events.txt and
containerd_containers.json are written to its shape; see the README there). As containerd does:

- an event is published when the test releases it (:meth:`Containerd.release`), and reaches
  the subscribers subscribed at that moment (nothing is replayed to a later one);
- Subscribe applies the request's filters (``field==value`` / ``field~=regexp`` on namespace
  and topic, comma-separated conditions all holding, any filter of the list matching; none:
  every event of every namespace) and ignores the namespace header;
- Get needs the ``containerd-namespace`` header (FAILED_PRECONDITION without it) and answers
  NOT_FOUND for a container whose ``/containers/delete`` was published.

Go's encoding/json writes a google.protobuf.Timestamp as ``{"seconds", "nanos"}`` (containerd
1.7 on; before it, gogo's stdtime as an RFC 3339 string, which the protobuf JSON mapping reads
as it is) and an Any as ``{"type_url", "value"}``; the timestamps are read as such, the Anys
(runtime options) left out.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import any_pb2, json_format, timestamp_pb2
from google.protobuf.message import Message

from gpulens.protos.containerd.events import container_pb2, image_pb2, snapshot_pb2, task_pb2
from gpulens.protos.containerd.services.containers.v1 import containers_pb2, containers_pb2_grpc
from gpulens.protos.containerd.services.events.v1 import events_pb2, events_pb2_grpc
from gpulens.testing.grpc_sockets import unix_socket_server

TOPICS: dict[str, type[Message]] = {
    "/containers/create": container_pb2.ContainerCreate,
    "/containers/delete": container_pb2.ContainerDelete,
    "/tasks/create": task_pb2.TaskCreate,
    "/tasks/start": task_pb2.TaskStart,
    "/tasks/oom": task_pb2.TaskOOM,
    "/tasks/exit": task_pb2.TaskExit,
    "/tasks/delete": task_pb2.TaskDelete,
    "/tasks/exec-added": task_pb2.TaskExecAdded,
    "/tasks/exec-started": task_pb2.TaskExecStarted,
    "/images/create": image_pb2.ImageCreate,
    "/images/update": image_pb2.ImageUpdate,
    "/images/delete": image_pb2.ImageDelete,
    "/snapshot/prepare": snapshot_pb2.SnapshotPrepare,
    "/snapshot/commit": snapshot_pb2.SnapshotCommit,
    "/snapshot/remove": snapshot_pb2.SnapshotRemove,
}
"""The message each topic carries (containerd's runtime/v2 and metadata packages publish them so;
a real stream mixes the image and snapshot events of image pulls in with the containers')."""

_LINE = re.compile(r"^(\S+ \S+) \+0000 UTC (\S+) (\S+) (\{.*\})$")
_CONDITION = re.compile(r'^(\w+)(==|~=)"?(.*?)"?$')


def _go_time(text: str) -> timestamp_pb2.Timestamp:
    """``2026-11-03 12:00:01.2`` (Go's time.Time.String(), UTC, trailing zeros trimmed)."""
    whole, _, fraction = text.partition(".")
    seconds = int(datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp())
    return timestamp_pb2.Timestamp(seconds=seconds, nanos=int(fraction.ljust(9, "0")) if fraction else 0)


def _proto_json(value: Any) -> Any:
    """Go's encoding/json of a containerd message as the protobuf JSON mapping reads it."""
    if isinstance(value, dict):
        if set(value) <= {"seconds", "nanos"} and value:
            stamp = timestamp_pb2.Timestamp(seconds=value.get("seconds", 0), nanos=value.get("nanos", 0))
            return stamp.ToJsonString()
        return {k: _proto_json(v) for k, v in value.items() if not (isinstance(v, dict) and "type_url" in v)}
    if isinstance(value, list):
        return [_proto_json(v) for v in value]
    return value


def read_ctr_events(path: Path) -> list[events_pb2.Envelope]:
    """The envelopes of a ``ctr events`` transcript (``#`` lines are comments)."""
    envelopes = []
    for line in path.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        if match is None:
            raise ValueError(f"not a `ctr events` line: {line!r}")
        stamp, namespace, topic, payload = match.groups()
        event = json_format.ParseDict(_proto_json(json.loads(payload)), TOPICS[topic]())
        envelopes.append(
            events_pb2.Envelope(
                timestamp=_go_time(stamp),
                namespace=namespace,
                topic=topic,
                # containerd's typeurl names a message by its full name, without a prefix
                event=any_pb2.Any(type_url=event.DESCRIPTOR.full_name, value=event.SerializeToString()),
            )
        )
    return envelopes


def read_ctr_containers(path: Path) -> dict[str, containers_pb2.Container]:
    """Container id -> the container ``ctr containers info`` printed (id, labels, image, times)."""
    found = {}
    for info in json.loads(path.read_text())["containers"]:
        container = containers_pb2.Container(
            id=info["ID"],
            labels=info["Labels"],
            image=info["Image"],
            runtime=containers_pb2.Container.Runtime(name=info["Runtime"]["Name"]),
            snapshotter=info["Snapshotter"],
            snapshot_key=info["SnapshotKey"],
            sandbox=info["SandboxID"],
        )
        container.created_at.FromJsonString(info["CreatedAt"])
        container.updated_at.FromJsonString(info["UpdatedAt"])
        found[container.id] = container
    return found


def matches(filters: list[str], envelope: events_pb2.Envelope) -> bool:
    """containerd's filter semantics for the fields a subscriber filters on (namespace, topic)."""
    if not filters:
        return True
    fields = {"namespace": envelope.namespace, "topic": envelope.topic}
    for one in filters:
        held = True
        for condition in one.split(","):
            match = _CONDITION.match(condition.strip())
            if match is None:
                raise ValueError(f"unsupported filter {one!r}")
            name, operator, wanted = match.groups()
            value = fields.get(name, "")
            held &= value == wanted if operator == "==" else re.search(wanted, value) is not None
        if held:
            return True
    return False


class Containerd(events_pb2_grpc.EventsServicer, containers_pb2_grpc.ContainersServicer):
    """Events and Containers of one containerd: what was published, who is subscribed."""

    def __init__(
        self, envelopes: list[events_pb2.Envelope], containers: dict[str, containers_pb2.Container]
    ) -> None:
        self._pending = list(envelopes)
        self._containers = dict(containers)
        self._published: list[events_pb2.Envelope] = []
        self._changed = threading.Condition()
        self.subscriptions: list[tuple[list[str], dict[str, str]]] = []
        """Each Subscribe call's filters and metadata, in order."""
        self.active = 0
        """Subscribe calls in progress."""

    def release(self, until: datetime | None = None, *, quietly: bool = False) -> int:
        """Publish the recorded events up to ``until`` (all: None); ``quietly``: as before a
        restart, to no subscriber. Returns how many were published."""
        limit = None if until is None else (int(until.timestamp()), until.microsecond * 1000)
        with self._changed:
            count = 0
            while self._pending and (limit is None or _key(self._pending[0].timestamp) <= limit):
                envelope = self._pending.pop(0)
                if envelope.topic == "/containers/delete":
                    deleted = container_pb2.ContainerDelete.FromString(envelope.event.value)
                    self._containers.pop(deleted.id, None)
                if not quietly:
                    self._published.append(envelope)
                count += 1
            self._changed.notify_all()
            return count

    def Subscribe(self, request: events_pb2.SubscribeRequest, context: grpc.ServicerContext) -> Any:
        filters = list(request.filters)
        with self._changed:
            self.subscriptions.append((filters, dict(context.invocation_metadata())))
            self.active += 1
            cursor = len(self._published)
            self._changed.notify_all()
        try:
            while context.is_active():
                with self._changed:
                    if cursor == len(self._published):
                        self._changed.wait(0.05)
                        continue
                    envelope = self._published[cursor]
                cursor += 1
                if matches(filters, envelope):
                    yield envelope
        finally:
            with self._changed:
                self.active -= 1
                self._changed.notify_all()

    def Get(self, request: containers_pb2.GetContainerRequest, context: grpc.ServicerContext) -> Any:
        if not dict(context.invocation_metadata()).get("containerd-namespace"):
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "namespace is required: failed precondition")
        with self._changed:
            container = self._containers.get(request.id)
        if container is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"container {request.id!r} in namespace: not found")
        return containers_pb2.GetContainerResponse(container=container)

    def wait_subscribed(self, count: int, timeout: float = 30.0) -> None:
        """Until ``count`` Subscribe calls came in and one is in progress."""
        with self._changed:
            if not self._changed.wait_for(lambda: len(self.subscriptions) >= count and self.active, timeout):
                raise TimeoutError(f"{len(self.subscriptions)} subscriptions, {self.active} in progress")


def _key(stamp: timestamp_pb2.Timestamp) -> tuple[int, int]:
    return stamp.seconds, stamp.nanos


@contextmanager
def serving(socket_path: Path, containerd: Containerd) -> Iterator[Containerd]:
    """``containerd`` answering on ``socket_path`` until the block ends (then its streams break,
    as when containerd restarts)."""

    def register(server: grpc.Server) -> None:
        events_pb2_grpc.add_EventsServicer_to_server(containerd, server)
        containers_pb2_grpc.add_ContainersServicer_to_server(containerd, server)

    with unix_socket_server(socket_path, register):
        yield containerd
