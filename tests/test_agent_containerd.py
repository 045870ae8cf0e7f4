"""Container lifecycle from containerd, end to end: `gpulens agent` (a real process) follows a
containerd that speaks containerd's own gRPC API on a unix socket (gpulens/testing/fake_containerd.py,
serving the recorded `ctr events` stream of tests/fixtures/containerd_events.txt), joins the
devices the kubelet's pod-resources API says each container holds, and publishes ContainerEvents
to the real broker. The expected records are written out below from the fixture's lines (its
times, exit statuses and OOM kill), not computed by the agent's code.

The same run checks the degradations: containerd's socket missing at start (one log line, the
agent keeps publishing, and subscribes once the socket appears) and containerd restarting (the
stream breaks, one log line, the agent subscribes again and takes the events that follow).
Below it: the schema change is a BACKWARD-compatible evolution in the real registry, and the
instance rules for an agent that subscribed mid-life.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

import fastavro
from confluent_kafka import Consumer
from google.protobuf import json_format
from prometheus_client.parser import text_string_to_metric_families

from gpulens.platform import free_port
from gpulens.producers.agent.collecting import Identity, RuntimeChange
from gpulens.producers.agent.containerd import ContainerdWatcher
from gpulens.producers.agent.events import ContainerTracker, LifecycleTracker, NodeIdentity
from gpulens.protos.containerd.events import container_pb2, task_pb2
from gpulens.schemas.model.avro_schema import committed
from gpulens.schemas.model.models import ChangeType, ContainerEvent, ContainerRuntimeState, DeviceAssignment
from gpulens.schemas.model.topics import CONTAINERS, entity_key
from gpulens.schemas.wire.codec import register, registry_client
from gpulens.testing.examples import example_events
from gpulens.testing.fake_containerd import (
    TOPICS,
    Containerd,
    matches,
    read_ctr_containers,
    read_ctr_events,
    serving,
)
from gpulens.testing.fake_kubelet import serving as serving_kubelet

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
EVENTS, CONTAINERS_INFO = FIXTURES / "containerd_events.txt", FIXTURES / "containerd_containers.json"
CAPTURED = FIXTURES / "containerd_events_captured.txt"
"""Real `ctr events` lines (three public captures, see its header)."""

POD_UID = "3f6c1e2a-7b1d-4c55-9a0e-5d2f8b6c9e41"
MAIN_0 = "9bd8269ce7accbc089a0d0e85cef6a39575644be475782410d1d126f028a313d"
MAIN_1 = "89df50537dd8255045c51a11011f78687d305920ecd63495415354c6c4d205a3"
SIDECAR = "6c8b4535ccc87f19061c4646189e33d78f01c8b63dc4e3cb2f630b1796ee93b6"
GPUS = ["GPU-7f3a5c1e", "GPU-91c2d4b8"]

CREATED, RUNNING = ContainerRuntimeState.CREATED, ContainerRuntimeState.RUNNING
EXITED, DELETED = ContainerRuntimeState.EXITED, ContainerRuntimeState.DELETED
ADDED, MODIFIED, GONE = ChangeType.ADDED, ChangeType.MODIFIED, ChangeType.DELETED
LIFECYCLE_FIELDS = ("state", "exit_code", "exited_at", "oom_killed")


def at(clock: str) -> datetime:
    """A time of the fixture's day (2026-11-03, UTC), e.g. ``12:01:35.431``."""
    return datetime.fromisoformat(f"2026-11-03T{clock}+00:00")


Row = tuple[str, str | None, ChangeType, ContainerRuntimeState | None, int | None, bool, datetime | None]
"""(container, container id, type, state, exit code, OOM-killed, exited at) of one record."""

# Until the pod's teardown (the fixture up to 12:06:40.5): the first instance of main starts,
# is OOM-killed (TaskOOM, then exit 137; the TaskDelete repeating it says nothing new), the
# kubelet's restart creates a second instance, which completes with 0. TaskCreate repeats
# CREATED, the exec probe's exit is not the container's, the sandbox and the moby namespace's
# container are no pod's containers: none of them is a record.
BEFORE_TEARDOWN: list[tuple[Row, datetime]] = [
    (("main", MAIN_0, ADDED, CREATED, None, False, None), at("12:00:01.200")),
    (("main", MAIN_0, MODIFIED, RUNNING, None, False, None), at("12:00:01.540")),
    (("sidecar", SIDECAR, ADDED, CREATED, None, False, None), at("12:00:01.602")),
    (("sidecar", SIDECAR, MODIFIED, RUNNING, None, False, None), at("12:00:01.712")),
    (("main", MAIN_0, MODIFIED, RUNNING, None, True, None), at("12:01:35.412")),
    (("main", MAIN_0, MODIFIED, EXITED, 137, True, at("12:01:35.430")), at("12:01:35.431")),
    (("main", MAIN_1, ADDED, CREATED, None, False, None), at("12:01:46.003")),
    (("main", MAIN_1, MODIFIED, RUNNING, None, False, None), at("12:01:46.320")),
    (("main", MAIN_1, MODIFIED, EXITED, 0, False, at("12:06:39.998")), at("12:06:40.000")),
]
# The teardown, after containerd restarted: the sidecar's SIGTERM exit, then the kubelet removes
# the containers; the first instance of main is superseded, so its removal is no record.
TEARDOWN: list[tuple[Row, datetime]] = [
    (("sidecar", SIDECAR, MODIFIED, EXITED, 143, False, at("12:06:41.018")), at("12:06:41.019")),
    (("main", MAIN_1, GONE, DELETED, 0, False, at("12:06:39.998")), at("12:06:42.107")),
    (("sidecar", SIDECAR, GONE, DELETED, 143, False, at("12:06:41.018")), at("12:06:42.210")),
]


class Records:
    """The node's ContainerEvents on the topic, read as they come."""

    def __init__(self, platform, codec, node: str, unique: str) -> None:
        self._codec = codec
        self._key = entity_key(platform.cluster, node)
        self._consumer = Consumer(
            platform.kafka.librdkafka(**{"group.id": f"containerd-{unique}", "auto.offset.reset": "earliest"})
        )
        self._consumer.subscribe([CONTAINERS.name])

    def take(self, count: int, agent: subprocess.Popen[bytes], timeout: float = 60) -> list[ContainerEvent]:
        found: list[ContainerEvent] = []
        deadline = time.monotonic() + timeout
        while len(found) < count:
            assert agent.poll() is None, f"the agent exited ({agent.returncode})"
            assert time.monotonic() < deadline, f"{len(found)} of {count} records: {found}"
            message = self._consumer.poll(0.2)
            if message is not None and message.error() is None and message.key() == self._key:
                found.append(self._codec.decode(CONTAINERS, message.value()))
        return found

    def close(self) -> None:
        self._consumer.close()


def wait_connected(url: str, want: float, agent: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """Until the agent's /metrics says gpulens_agent_runtime_connected{collector="containerd"} ``want``."""
    deadline = time.monotonic() + timeout
    while True:
        assert agent.poll() is None, f"the agent exited ({agent.returncode})"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                text = response.read().decode()
        except OSError:
            text = ""
        values = [
            s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "gpulens_agent_runtime_connected" and s.labels == {"collector": "containerd"}
        ]
        if values == [want]:
            return
        assert time.monotonic() < deadline, f"gpulens_agent_runtime_connected: {values}, not {want}"
        time.sleep(0.05)


def rows(records: list[ContainerEvent]) -> list[tuple[Row, datetime]]:
    return [
        (
            (r.container_name, r.container_id, r.type, r.state, r.exit_code, r.oom_killed, r.exited_at),
            r.event_time,
        )
        for r in records
    ]


def test_the_agent_publishes_a_pods_container_lifecycle_from_containerd(
    platform, codec, config_file, unique, tmp_path, spawned
):
    node = f"gpu-node-{unique}"
    kubelet_socket, containerd_socket = tmp_path / "kubelet.sock", tmp_path / "containerd.sock"
    port = free_port()
    metrics = f"http://127.0.0.1:{port}/metrics"
    env = {
        **os.environ,
        "GPULENS_CONFIG": str(config_file),
        "NODE_NAME": node,
        "GPULENS_AGENT__COLLECTORS": json.dumps(["pod-resources", "containerd"]),
        "GPULENS_AGENT__SAMPLE_INTERVAL_S": "0.2",
        "GPULENS_AGENT__SPOOL_DIR": str(tmp_path / "spool"),
        "GPULENS_AGENT__POD_RESOURCES_SOCKET": str(kubelet_socket),
        "GPULENS_AGENT__CONTAINERD_SOCKET": str(containerd_socket),
        "GPULENS_AGENT__CONTAINERD_RETRY_MIN_S": "0.05",
        "GPULENS_AGENT__CONTAINERD_RETRY_MAX_S": "0.2",
        "GPULENS_AGENT__METRICS_PORT": str(port),
    }
    envelopes = read_ctr_events(EVENTS)
    records = Records(platform, codec, node, unique)
    try:
        with serving_kubelet(kubelet_socket) as kubelet:
            kubelet.pods = {("ml", "train-0"): {"amd.com/gpu": GPUS}}
            agent = subprocess.Popen(
                [sys.executable, "-m", "gpulens", "agent"],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            spawned.append(agent)

            # No containerd yet: the kubelet's view is published all the same.
            [held] = records.take(1, agent)
            assert (held.type, held.container_name, held.state) == (ADDED, "main", None)
            assert sorted(d.device_id for d in held.devices) == GPUS
            wait_connected(metrics, 0, agent)

            first = Containerd(envelopes, read_ctr_containers(CONTAINERS_INFO))
            with serving(containerd_socket, first):
                first.wait_subscribed(1)  # found once the socket appeared
                wait_connected(metrics, 1, agent)
                filters, metadata = first.subscriptions[0]
                assert metadata["containerd-namespace"] == "k8s.io"
                wanted = [
                    e
                    for e in envelopes
                    if e.namespace == "k8s.io" and e.topic.startswith(("/tasks/", "/containers/"))
                ]
                assert [e for e in envelopes if matches(filters, e)] == wanted
                first.release(until=at("12:06:40.500"))
                published = records.take(len(BEFORE_TEARDOWN), agent)
                assert rows(published) == BEFORE_TEARDOWN
                for record in published:
                    held_now = GPUS if record.container_name == "main" else []
                    assert sorted(d.device_id for d in record.devices) == held_now
                    assert (record.pod_namespace, record.pod_name, record.pod_uid) == (
                        "ml",
                        "train-0",
                        POD_UID,
                    )
                    assert (record.node, record.cluster) == (node, platform.cluster)

                # The pod is deleted: the kubelet stops listing it.
                kubelet.pods = {}
                [released] = records.take(1, agent)
                assert (released.type, released.container_name, released.devices) == (GONE, "main", [])

            # containerd restarts (its streams break) and the teardown follows.
            wait_connected(metrics, 0, agent)
            restarted = Containerd(envelopes, read_ctr_containers(CONTAINERS_INFO))
            restarted.release(until=at("12:06:40.500"), quietly=True)
            with serving(containerd_socket, restarted):
                restarted.wait_subscribed(1)
                restarted.release()
                teardown = records.take(len(TEARDOWN), agent)
                assert rows(teardown) == TEARDOWN
                assert all(r.devices == [] and r.pod_uid == POD_UID for r in teardown)

                agent.send_signal(signal.SIGTERM)
                _, errors = agent.communicate(timeout=60)
        log = errors.decode()
        assert agent.returncode == 0, log
        # One line per outage (missing socket, restart), however many tries each took.
        assert log.count("containerd events unavailable") == 2, log
        assert log.count("containerd events: subscribed") == 2, log
        assert log.count(f"no containerd socket at {containerd_socket}") == 1, log
    finally:
        records.close()


def test_the_lifecycle_fields_are_a_backward_compatible_evolution_of_container_event(platform, unique):
    """The schema before them (the committed one less the four fields) and the new one, under one
    subject of the real registry: the new one registers (BACKWARD), an old reader decodes a
    record written with it, and a new reader decodes an old record with the defaults."""
    new_text = committed(ContainerEvent)
    old = json.loads(new_text)
    old["fields"] = [f for f in old["fields"] if f["name"] not in LIFECYCLE_FIELDS]
    assert len(old["fields"]) == len(json.loads(new_text)["fields"]) - len(LIFECYCLE_FIELDS)
    registry = registry_client(platform.registry.url)
    subject = f"containers-compat-{unique}-value"
    old_id = register(registry, subject, json.dumps(old))
    assert register(registry, subject, new_text) != old_id

    written = {
        **example_events()[CONTAINERS].model_dump(),
        "state": "EXITED",
        "exit_code": 137,
        "exited_at": at("12:01:35.430"),
        "oom_killed": True,
    }
    new_schema, old_schema = fastavro.parse_schema(json.loads(new_text)), fastavro.parse_schema(old)
    body = io.BytesIO()
    fastavro.schemaless_writer(body, new_schema, written)
    body.seek(0)
    assert fastavro.schemaless_reader(body, new_schema, old_schema) == {
        k: v for k, v in written.items() if k not in LIFECYCLE_FIELDS
    }
    body = io.BytesIO()
    fastavro.schemaless_writer(body, old_schema, example_events()[CONTAINERS].model_dump())
    body.seek(0)
    read = fastavro.schemaless_reader(body, old_schema, new_schema)
    assert {k: read[k] for k in LIFECYCLE_FIELDS} == {
        "state": None,
        "exit_code": None,
        "exited_at": None,
        "oom_killed": False,
    }


def test_an_agent_subscribed_mid_life_and_removals_out_of_order():
    """Events of an instance first seen late still say its state; an older instance's removal
    after the current one's changes nothing but another DELETED (never a resurrection)."""
    who = NodeIdentity("c1", "gpu-node-7", "node-agent")
    kubelet = ContainerTracker(who)
    kubelet.changes(
        {("ml", "train-0", "main"): (DeviceAssignment(resource_name="amd.com/gpu", device_id="G"),)},
        at("12:00:00"),
    )
    tracker = LifecycleTracker(who, kubelet)
    main = ("ml", "train-0", "main")
    old, new = Identity(main, POD_UID, at("12:00:01")), Identity(main, POD_UID, at("12:01:46"))

    def change(cid, identity, clock, state, **more):
        return RuntimeChange(cid, identity, at(clock), state, **more)

    got = tracker.changes(
        [
            # subscribed while the second instance ran: its exit is the first word of it
            change(MAIN_1, new, "12:06:40", EXITED, exit_code=0, exited_at=at("12:06:39.998")),
            change(MAIN_1, new, "12:06:42.107", DELETED),
            change(MAIN_0, old, "12:06:42.200", DELETED),
        ]
    )
    assert [
        (e.container_id, e.type, e.state, e.exit_code, [d.device_id for d in e.devices]) for e in got
    ] == [
        (MAIN_1, MODIFIED, EXITED, 0, ["G"]),
        (MAIN_1, GONE, DELETED, 0, []),
        (MAIN_0, GONE, DELETED, None, []),
    ]
    assert kubelet.held == {}  # forgotten: the kubelet's view, if it still lists it, is ADDED again


def captured_lines() -> list[tuple[str, str, dict[str, Any]]]:
    """(namespace, topic, event JSON) of each line of the real capture, read without our parser."""
    found = []
    for line in CAPTURED.read_text().splitlines():
        if line and not line.startswith("#"):
            head, _, payload = line.partition(" {")
            *_, namespace, topic = head.split(" ")
            found.append((namespace, topic, json.loads("{" + payload)))
    return found


def test_real_ctr_events_are_read_as_containerd_wrote_them_and_only_containers_own_changes_count(tmp_path):
    """The captured lines (three public captures, see the fixture's header), served by the fake
    containerd to the agent's watcher over the real gRPC socket.

    Each line decodes to what the capture printed (exit times as an RFC 3339 string in the older
    captures, as {"seconds","nanos"} in containerd 1.7's). The watcher's subscription lets through
    the task and container events, not the image pull's. None is a change the agent reports: every
    captured exit's "id" is an exec's, not its container's, and the one container created (the
    kubelet's, in the MicroK8s capture) is unknown to Containers/Get (its labels were not
    captured), as a container containerd no longer has. A container's create from the hand-written
    fixture, published after them on the same stream, is the only change."""
    lines = captured_lines()
    exits = [event for _, topic, event in lines if topic == "/tasks/exit"]
    assert len(exits) == 3 and all(e["id"] != e["container_id"] for e in exits)
    assert {namespace for namespace, _, _ in lines} == {"k8s.io"}

    envelopes = read_ctr_events(CAPTURED)
    for envelope, (namespace, topic, written) in zip(envelopes, lines, strict=True):
        assert (envelope.namespace, envelope.topic) == (namespace, topic)
        message = TOPICS[topic].FromString(envelope.event.value)
        assert envelope.event.type_url == message.DESCRIPTOR.full_name
        decoded = json_format.MessageToDict(message, preserving_proto_field_name=True)
        stamp, exited = written.pop("exited_at", None), decoded.pop("exited_at", None)
        assert decoded == written  # zero values (exit_status 0) left out on both sides
        if isinstance(stamp, dict):
            assert isinstance(message, task_pb2.TaskExit)
            assert (message.exited_at.seconds, message.exited_at.nanos) == (stamp["seconds"], stamp["nanos"])
        else:
            assert exited == stamp

    created = next(
        e
        for e in read_ctr_events(EVENTS)
        if e.topic == "/containers/create"
        and container_pb2.ContainerCreate.FromString(e.event.value).id == MAIN_0
    )
    socket_path = tmp_path / "containerd.sock"
    containerd = Containerd([*envelopes, created], read_ctr_containers(CONTAINERS_INFO))
    watcher = ContainerdWatcher(socket_path, retry_min_s=0.05, retry_max_s=0.2)
    with serving(socket_path, containerd):
        watcher.start()
        try:
            containerd.wait_subscribed(1)
            filters, _ = containerd.subscriptions[0]
            assert [e.topic for e in envelopes if matches(filters, e)] == [
                topic for _, topic, _ in lines if topic.startswith(("/tasks/", "/containers/"))
            ]
            assert containerd.release() == len(envelopes) + 1
            changes: list[RuntimeChange] = []
            deadline = time.monotonic() + 30
            while not changes:
                assert time.monotonic() < deadline, "no change from the stream"
                changes += watcher.changes()
                time.sleep(0.02)
        finally:
            watcher.close()
    changes += watcher.changes()
    assert [(c.container_id, c.identity.key, c.state, c.at) for c in changes] == [
        (MAIN_0, ("ml", "train-0", "main"), CREATED, at("12:00:01.200"))
    ]
