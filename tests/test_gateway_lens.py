"""Primus-Lens's StreamContainerEvents on the gateway: a real gRPC client streams a container's life
as a Lens node exporter reports it (exporter.ContainerEvent: its status as the type, its
container document as a google.protobuf.Struct), and the ContainerEvents on the real broker say
what those documents say (expected values written out from them below)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import grpc
import pytest
from google.protobuf import struct_pb2
from test_agent_publishing import read_topic

from gpulens.producers.gateway import Gateway, running_gateway
from gpulens.protos.lens.v1 import exporter_pb2, exporter_pb2_grpc
from gpulens.schemas.model.models import ChangeType, ContainerEvent, ContainerRuntimeState, DeviceKind
from gpulens.schemas.model.topics import CONTAINERS, entity_key
from gpulens.testing.gateway_support import TOKEN, gateway_settings

CONTAINER = "9bd8269ce7accbc089a0d0e85cef6a39575644be475782410d1d126f028a313d"
AUTH = (("authorization", f"Bearer {TOKEN}"),)


def document(status: str, updated: str, **more: object) -> dict[str, object]:
    """A container document as Lens's node exporter encodes model.Container (the CRI
    ContainerStatus fields inline, then Lens's own), for pod ml/train-0's container "main"."""
    return {
        "id": CONTAINER,
        "metadata": {"name": "main", "attempt": 0},
        "labels": {
            "io.kubernetes.container.name": "main",
            "io.kubernetes.pod.name": "train-0",
            "io.kubernetes.pod.namespace": "ml",
            "io.kubernetes.pod.uid": "3f6c1e2a-7b1d-4c55-9a0e-5d2f8b6c9e41",
        },
        "pod_name": "train-0",
        "pod_namespace": "ml",
        "pod_uuid": "3f6c1e2a-7b1d-4c55-9a0e-5d2f8b6c9e41",
        "image": "docker.io/rocm/pytorch:rocm6.2_ubuntu22.04_py3.10_pytorch_release_2.3.0",
        "devices": {
            "gpu": [
                {
                    "name": "AMD Instinct MI300X",
                    "id": 0,
                    "path": "/dev/dri/card1",
                    "kind": "GPU",
                    "uuid": "0x74a1",
                    "serial": "692251001124",
                    "slot": "0000:05:00.0",
                },
                {
                    "name": "AMD Instinct MI300X",
                    "id": 1,
                    "path": "/dev/dri/card2",
                    "kind": "GPU",
                    "uuid": "0x74a1",
                    "serial": "692251001125",
                    "slot": "0000:15:00.0",
                },
            ],
            "infiniband": [
                {
                    "name": "rdma0",
                    "id": 3,
                    "path": "/dev/infiniband/uverbs0",
                    "kind": "RDMA",
                    "uuid": "0c42:a103:00f2:1b40",
                    "serial": "rdma0",
                    "slot": "0",
                }
            ],
        },
        "status": status,
        "oom_killed": False,
        "exit_time": "0001-01-01T00:00:00Z",
        "last_updated": updated,
        **more,
    }


def lens_event(kind: str, data: dict[str, object], node: str) -> exporter_pb2.ContainerEvent:
    struct = struct_pb2.Struct()
    struct.update(data)
    return exporter_pb2.ContainerEvent(type=kind, container_id=CONTAINER, data=struct, node=node)


@pytest.fixture
def channel(platform, codec) -> Iterator[grpc.Channel]:
    gateway = Gateway(gateway_settings(), platform.kafka, codec, cluster=platform.cluster)
    with running_gateway(gateway) as gw, grpc.insecure_channel(f"127.0.0.1:{gw.port}") as channel:
        yield channel


def test_a_lens_exporters_container_events_become_container_events(platform, codec, unique, channel):
    node = f"lens-node-{unique}"
    events = [
        lens_event("snapshot", document("Running", "2026-11-03T12:00:02Z"), node),
        lens_event("OOMKilled", document("OOMKilled", "2026-11-03T12:01:35.412Z", oom_killed=True), node),
        lens_event(
            "Exit",
            document(
                "Exit",
                "2026-11-03T12:01:35.431Z",
                oom_killed=True,
                exit_code=137,
                exit_time="2026-11-03T12:01:35.430Z",
            ),
            node,
        ),
        lens_event("Deleted", document("Deleted", "2026-11-03T12:06:42.011Z", exit_code=137), node),
        # A Docker container (no pod) and a status Lens does not define: skipped, as Lens does.
        lens_event("Running", {"id": "c6142cdbbd05", "status": "Running"}, node),
        lens_event("Paused", document("Paused", "2026-11-03T12:07:00Z"), node),
    ]
    stream = exporter_pb2_grpc.ExporterServiceStub(channel).StreamContainerEvents
    call = stream(iter(events), metadata=AUTH)
    assert list(call) == []  # nothing per event, as Lens's server
    assert call.code() == grpc.StatusCode.OK
    assert dict(call.trailing_metadata()) == {"gpulens-published": "4", "gpulens-skipped": "2"}

    values = read_topic(platform.kafka, CONTAINERS, entity_key(platform.cluster, node), 4)
    got = [codec.decode(CONTAINERS, value, ContainerEvent) for value in values]
    running, exited, deleted = (
        ContainerRuntimeState.RUNNING,
        ContainerRuntimeState.EXITED,
        ContainerRuntimeState.DELETED,
    )
    assert [(e.type, e.state, e.exit_code, e.oom_killed, e.exited_at, e.event_time) for e in got] == [
        (ChangeType.MODIFIED, running, None, False, None, datetime(2026, 11, 3, 12, 0, 2, tzinfo=UTC)),
        (
            ChangeType.MODIFIED,
            running,
            None,
            True,
            None,
            datetime(2026, 11, 3, 12, 1, 35, 412000, tzinfo=UTC),
        ),
        (
            ChangeType.MODIFIED,
            exited,
            137,
            True,
            datetime(2026, 11, 3, 12, 1, 35, 430000, tzinfo=UTC),
            datetime(2026, 11, 3, 12, 1, 35, 431000, tzinfo=UTC),
        ),
        (ChangeType.DELETED, deleted, 137, False, None, datetime(2026, 11, 3, 12, 6, 42, 11000, tzinfo=UTC)),
    ]
    for event in got:
        assert (event.cluster, event.node, event.source) == (platform.cluster, node, "primus-lens-exporter")
        assert (event.pod_namespace, event.pod_name, event.container_name) == ("ml", "train-0", "main")
        assert (event.pod_uid, event.container_id) == ("3f6c1e2a-7b1d-4c55-9a0e-5d2f8b6c9e41", CONTAINER)
    assert [(d.device_id, d.kind) for d in got[0].devices] == [
        ("692251001124", DeviceKind.GPU),
        ("692251001125", DeviceKind.GPU),
        ("rdma0", DeviceKind.RDMA),
    ]
    assert got[3].devices == []


def test_a_call_without_a_token_is_refused_and_docker_containers_are_not_served(channel):
    stub = exporter_pb2_grpc.ExporterServiceStub(channel)
    with pytest.raises(grpc.RpcError) as refused:
        list(stub.StreamContainerEvents(iter([]), metadata=(("authorization", "Bearer wrong"),)))
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as docker:
        list(stub.StreamDockerContainerEvents(iter([]), metadata=AUTH))
    assert docker.value.code() == grpc.StatusCode.UNIMPLEMENTED
