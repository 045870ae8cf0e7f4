"""Container lifecycle from containerd's event stream, over its gRPC socket.

A thread of its own holds one ``containerd.services.events.v1.Events/Subscribe`` call, filtered
to the ``k8s.io`` namespace (the CRI's) and to the ``/tasks/`` and ``/containers/`` topics, and
turns each envelope into a :class:`RuntimeChange`: create, start, OOM, exit (with its status and
time) and delete. The Kubernetes identity of a container comes from its CRI labels
(``io.kubernetes.pod.namespace``, ``.pod.name``, ``.pod.uid``, ``.container.name``), read once
per container with ``Containers/Get`` and cached until the container is deleted (a deleted one
can no longer be read). Pod sandboxes (the pause containers) and containers that are not a
pod's are skipped. The agent's loop takes the changes each round (:meth:`ContainerdWatcher.changes`).

containerd missing or restarting never stops the agent: the watcher logs once when the stream
is lost, tries again with exponential backoff (``retry_min_s`` doubling to ``retry_max_s``), and
logs once when it is subscribed again. Events of the gap are not replayed (containerd keeps
none); the next change of each container says its state again.
"""

from __future__ import annotations

import logging
import queue
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from gpulens.producers.agent.collecting import Identity, RuntimeChange
from gpulens.protos.containerd.events import container_pb2, task_pb2
from gpulens.protos.containerd.services.containers.v1 import containers_pb2, containers_pb2_grpc
from gpulens.protos.containerd.services.events.v1 import events_pb2, events_pb2_grpc
from gpulens.schemas.model.models import ContainerRuntimeState

log = logging.getLogger(__name__)

NAMESPACE_HEADER = "containerd-namespace"
"""The gRPC metadata key containerd reads a call's namespace from."""

POD_NAMESPACE = "io.kubernetes.pod.namespace"
POD_NAME = "io.kubernetes.pod.name"
POD_UID = "io.kubernetes.pod.uid"
CONTAINER_NAME = "io.kubernetes.container.name"
"""The CRI's labels on every container of a pod (a sandbox has all but the container name)."""

_EVENTS: dict[str, type[Message]] = {
    message.DESCRIPTOR.full_name: message
    for message in (
        container_pb2.ContainerCreate,
        container_pb2.ContainerDelete,
        task_pb2.TaskCreate,
        task_pb2.TaskStart,
        task_pb2.TaskOOM,
        task_pb2.TaskExit,
        task_pb2.TaskDelete,
    )
}
"""The event types read, by the name their ``Any`` carries (``containerd.events.TaskExit``)."""


def subscribe_filters(namespace: str) -> list[str]:
    """containerd filters (any of them matches) for the task and container events of ``namespace``.

    Subscribe ignores the namespace header: without ``namespace==`` every namespace's events
    would come (Docker's ``moby``, ``ctr``'s ``default``)."""
    return [f'namespace=="{namespace}",topic~="^/tasks/"', f'namespace=="{namespace}",topic~="^/containers/"']


def _time(stamp: Timestamp) -> datetime:
    """Exact to the microsecond (a float of seconds would turn .430 into .429999)."""
    return datetime.fromtimestamp(stamp.seconds, UTC) + timedelta(microseconds=stamp.nanos // 1000)


class ContainerdWatcher:
    """Follows containerd's events on its own thread; :meth:`changes` hands them over."""

    name = "containerd"

    def __init__(
        self,
        socket_path: Path,
        *,
        namespace: str = "k8s.io",
        timeout_s: float = 5.0,
        retry_min_s: float = 0.5,
        retry_max_s: float = 30.0,
    ) -> None:
        self._path = socket_path
        self._metadata = ((NAMESPACE_HEADER, namespace),)
        self._filters = subscribe_filters(namespace)
        self._timeout = timeout_s
        self._retry = (retry_min_s, retry_max_s)
        self._queue: queue.SimpleQueue[RuntimeChange] = queue.SimpleQueue()
        self._identities: dict[str, Identity | None] = {}
        """Container id -> its identity (None: not a pod's container), until it is deleted."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._call: grpc.Future | None = None
        self._lock = threading.Lock()  # guards _call between the watcher thread and close()
        self.connected = False
        """Whether the event stream is subscribed now (read by the agent's loop for its gauge)."""
        self._lost: bool | None = False
        """False before the first try, True once a failure was logged, None while subscribed: one
        warning per outage, one info line per subscription."""

    def start(self) -> None:
        """Start following; never unavailable: a missing socket is waited for (with backoff)."""
        self._thread = threading.Thread(target=self._run, name="containerd-events", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            if self._call is not None:
                self._call.cancel()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def changes(self) -> list[RuntimeChange]:
        """The changes that arrived since the last call, in containerd's order."""
        out: list[RuntimeChange] = []
        while True:
            try:
                out.append(self._queue.get_nowait())
            except queue.Empty:
                return out

    # --- the watcher thread ----------------------------------------------------------------------

    def _run(self) -> None:
        delay = self._retry[0]
        while not self._stop.is_set():
            problem = self._follow()
            self.connected = False
            if self._stop.is_set():
                return
            if self._lost is None:  # subscribed, then the stream ended: retry at the shortest wait
                delay = self._retry[0]
            if self._lost is not True:
                log.warning("containerd events unavailable (%s); retrying with backoff", problem)
            self._lost = True
            self._stop.wait(delay)
            delay = min(delay * 2, self._retry[1])

    def _follow(self) -> str:
        """One subscription, until it ends (``_lost`` None once it got through); why it ended."""
        if not self._path.is_socket():
            return f"no containerd socket at {self._path} (mount /run/containerd)"
        channel = grpc.insecure_channel(f"unix://{self._path.resolve()}")
        try:
            try:
                grpc.channel_ready_future(channel).result(timeout=self._timeout)
            except grpc.FutureTimeoutError:
                return f"{self._path} does not answer"
            events = events_pb2_grpc.EventsStub(channel)
            containers = containers_pb2_grpc.ContainersStub(channel)
            call = events.Subscribe(
                events_pb2.SubscribeRequest(filters=self._filters), metadata=self._metadata
            )
            with self._lock:
                if self._stop.is_set():
                    call.cancel()
                self._call = call
            log.info("containerd events: subscribed on %s", self._path)
            self._lost, self.connected = None, True
            try:
                for envelope in call:
                    change = self._change(envelope, containers)
                    if change is not None:
                        self._queue.put(change)
            except grpc.RpcError as err:
                if self._stop.is_set():
                    return "stopped"
                code = err.code().name if isinstance(err, grpc.Call) else "UNKNOWN"
                return f"the event stream broke: {code}"
            return "containerd closed the event stream"
        finally:
            with self._lock:
                self._call = None
            channel.close()

    def _change(
        self, envelope: events_pb2.Envelope, containers: containers_pb2_grpc.ContainersStub
    ) -> RuntimeChange | None:
        """The change one envelope reports, or None (another event type, an exec, not a pod's)."""
        message_type = _EVENTS.get(envelope.event.TypeName())
        if message_type is None:
            return None
        # not Any.Unpack: containerd's type URLs have no "type.googleapis.com/" prefix, which it requires
        event = message_type.FromString(envelope.event.value)
        at = _time(envelope.timestamp)
        state: ContainerRuntimeState | None
        exit_code: int | None = None
        exited_at: datetime | None = None
        if isinstance(event, container_pb2.ContainerCreate | container_pb2.ContainerDelete):
            container_id = event.id
            created = isinstance(event, container_pb2.ContainerCreate)
            state = ContainerRuntimeState.CREATED if created else ContainerRuntimeState.DELETED
        else:
            container_id = event.container_id
            if isinstance(event, task_pb2.TaskExit | task_pb2.TaskDelete):
                if event.id not in ("", container_id):  # an exec'd process (a probe), not the container
                    return None
                state, exit_code = ContainerRuntimeState.EXITED, event.exit_status
                exited_at = _time(event.exited_at) if event.HasField("exited_at") else None
            elif isinstance(event, task_pb2.TaskStart):
                state = ContainerRuntimeState.RUNNING
            elif isinstance(event, task_pb2.TaskCreate):
                state = ContainerRuntimeState.CREATED
            else:  # TaskOOM
                state = None
        identity = self._identity(container_id, containers)
        if state is ContainerRuntimeState.DELETED:
            self._identities.pop(container_id, None)
        if identity is None:
            return None
        return RuntimeChange(
            container_id,
            identity,
            at,
            state,
            exit_code=exit_code,
            exited_at=exited_at,
            oom_killed=isinstance(event, task_pb2.TaskOOM),
        )

    def _identity(self, container_id: str, containers: containers_pb2_grpc.ContainersStub) -> Identity | None:
        """The container's pod and name from its labels (cached); None when it is no pod's."""
        if container_id in self._identities:
            return self._identities[container_id]
        try:
            found = containers.Get(
                containers_pb2.GetContainerRequest(id=container_id),
                metadata=self._metadata,
                timeout=self._timeout,
            ).container
        except grpc.RpcError as err:  # deleted already, or containerd going away: not cached
            code = err.code().name if isinstance(err, grpc.Call) else "UNKNOWN"
            log.debug("containerd Containers/Get %s: %s", container_id, code)
            return None
        labels = found.labels
        identity: Identity | None = None
        if all(label in labels for label in (POD_NAMESPACE, POD_NAME, CONTAINER_NAME)):
            identity = Identity(
                (labels[POD_NAMESPACE], labels[POD_NAME], labels[CONTAINER_NAME]),
                labels.get(POD_UID) or None,
                _time(found.created_at),
            )
        self._identities[container_id] = identity
        return identity
