"""The pod<->device mapping against a real gRPC pod-resources server on a unix socket."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpulens.producers.agent import AgentSettings, NodeIdentity
from gpulens.producers.agent.events import ContainerTracker
from gpulens.producers.agent.podresources import PodResourcesCollector
from gpulens.schemas.model.models import ChangeType, DeviceKind
from gpulens.testing.fake_kubelet import Kubelet, serving


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[tuple[Kubelet, Path]]:
    with serving(tmp_path / "kubelet.sock") as servicer:
        yield servicer, tmp_path / "kubelet.sock"


def test_a_device_moved_between_pods_gives_both_container_events(kubelet):
    servicer, socket_path = kubelet
    defaults = AgentSettings(node="gpu-node-7")
    collector = PodResourcesCollector(
        socket_path,
        gpu_patterns=defaults.gpu_resource_patterns,
        rdma_patterns=defaults.rdma_resource_patterns,
    )
    tracker = ContainerTracker(NodeIdentity("c1", "gpu-node-7", "node-agent"))
    t0 = datetime(2026, 11, 3, 12, 0, tzinfo=UTC)
    collector.start()
    try:
        servicer.pods = {
            ("team-a", "train-0"): {
                "nvidia.com/gpu": ["GPU-0", "GPU-1"],
                "rdma/hca_shared_devices_a": ["mlx5_0"],
                "example.com/fpga": ["fpga-3"],
            },
            ("team-b", "infer-0"): {"nvidia.com/mig-3g.40gb": ["MIG-9"]},
        }
        first = tracker.changes(collector.assignments(), t0)
        assert [(e.type, e.pod_name, e.container_name) for e in first] == [
            (ChangeType.ADDED, "train-0", "main"),  # sorted by namespace, pod, container
            (ChangeType.ADDED, "infer-0", "main"),
        ]
        assert {(d.device_id, d.kind) for d in first[0].devices} == {
            ("GPU-0", DeviceKind.GPU),
            ("GPU-1", DeviceKind.GPU),
            ("mlx5_0", DeviceKind.RDMA),
            ("fpga-3", DeviceKind.OTHER),
        }
        assert first[1].devices[0].kind == DeviceKind.GPU  # MIG profiles are GPUs

        # GPU-1 moves from train-0 to infer-0: the loser's event first, then the winner's.
        servicer.pods[("team-a", "train-0")]["nvidia.com/gpu"] = ["GPU-0"]
        servicer.pods[("team-b", "infer-0")]["nvidia.com/gpu"] = ["GPU-1"]
        moved = tracker.changes(collector.assignments(), t0 + timedelta(seconds=5))
        assert [(e.type, e.pod_namespace, e.pod_name) for e in moved] == [
            (ChangeType.MODIFIED, "team-a", "train-0"),
            (ChangeType.MODIFIED, "team-b", "infer-0"),
        ]
        assert "GPU-1" not in {d.device_id for d in moved[0].devices}
        assert {d.device_id for d in moved[1].devices} == {"GPU-1", "MIG-9"}
        assert all(e.node == "gpu-node-7" and e.cluster == "c1" for e in moved)

        # Nothing changed: nothing to say.
        assert tracker.changes(collector.assignments(), t0 + timedelta(seconds=10)) == []

        # train-0 goes away and a new pod gets its GPU: DELETED (no devices), then ADDED.
        del servicer.pods[("team-a", "train-0")]
        servicer.pods[("team-a", "train-1")] = {"nvidia.com/gpu": ["GPU-0"]}
        last = tracker.changes(collector.assignments(), t0 + timedelta(seconds=15))
        assert [(e.type, e.pod_name, [d.device_id for d in e.devices]) for e in last] == [
            (ChangeType.DELETED, "train-0", []),
            (ChangeType.ADDED, "train-1", ["GPU-0"]),
        ]
        assert len({e.event_id for e in first + moved + last}) == len(first + moved + last)
    finally:
        collector.close()
