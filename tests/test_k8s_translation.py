"""Kubernetes objects -> events, without I/O: quantities, GPU amounts, nodes, pods, workloads."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from gpulens.producers.kubernetes.gpus import GpuCatalog
from gpulens.producers.kubernetes.quantities import milli, parse_quantity, whole
from gpulens.producers.kubernetes.resources import BUILTIN_WORKLOADS, ResourceKind, Role
from gpulens.producers.kubernetes.settings import WatcherSettings
from gpulens.producers.kubernetes.translating import Translator, owner_chain
from gpulens.schemas.model.models import ChangeType, OwnerReference, WorkloadStatus

AT = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
WORKLOADS = {r.kind: r for r in BUILTIN_WORKLOADS}
PYTORCHJOB = ResourceKind("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob", Role.WORKLOAD)


@pytest.fixture
def translator() -> Translator:
    return Translator("c1", "k8s-watcher", GpuCatalog.from_settings(WatcherSettings()))


def container(name: str = "main", requests: dict | None = None, limits: dict | None = None) -> dict:
    return {"name": name, "image": "img:1", "resources": {"requests": requests or {}, "limits": limits or {}}}


def pod(containers: list[dict], **status: object) -> dict:
    return {
        "metadata": {
            "name": "p",
            "namespace": "ml",
            "uid": "pod-uid",
            "resourceVersion": "7",
            "creationTimestamp": "2025-01-01T00:00:00Z",
            "ownerReferences": [
                {
                    "kind": "ReplicaSet",
                    "apiVersion": "apps/v1",
                    "name": "rs",
                    "uid": "rs-uid",
                    "controller": True,
                }
            ],
        },
        "spec": {"containers": containers},
        "status": {"phase": "Pending", **status},
    }


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("250m", Decimal("0.25")),
        ("2", Decimal(2)),
        ("16Gi", Decimal(16 * 1024**3)),
        ("1.5", Decimal("1.5")),
        ("100M", Decimal(100_000_000)),
        ("1e3", Decimal(1000)),
        ("1E", Decimal(10**18)),
        ("512Ki", Decimal(512 * 1024)),
        (".5", Decimal("0.5")),
    ],
)
def test_quantities_parse_every_suffix_exactly(text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value


def test_quantities_round_up_like_kubernetes_and_reject_garbage() -> None:
    assert milli("0.0001") == 1
    assert milli("2") == 2000
    assert whole("1.5Ki") == 1536
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        parse_quantity("12 apples")


def test_gpu_amount_sums_containers_requests_else_limits_with_mig_and_milli_shares(translator) -> None:
    gpus = translator.pod_gpus(
        {
            "containers": [
                container("a", requests={"nvidia.com/gpu": "2", "cpu": "4"}, limits={"nvidia.com/gpu": "3"}),
                container("b", limits={"amd.com/gpu": "1"}),
                container("c", requests={"nvidia.com/mig-1g.10gb": "2"}),
                container("d", requests={"alibabacloud.com/gpu-milli": "250"}),
                container("e", requests={"cpu": "1"}),
            ]
        }
    )
    assert gpus == {
        "nvidia.com/gpu": 2,
        "amd.com/gpu": 1,
        "nvidia.com/mig-1g.10gb": 2,
        "alibabacloud.com/gpu-milli": 0.25,
    }


def test_node_translation_reads_ready_capacity_gpus_model_and_node_info(translator) -> None:
    node = {
        "metadata": {
            "name": "n1",
            "uid": "n1-uid",
            "resourceVersion": "42",
            "labels": {"amd.com/gpu.product-name": "AMD Instinct MI300X", "zone": "a"},
        },
        "spec": {"unschedulable": True, "taints": [{"key": "gpu", "effect": "NoSchedule"}]},
        "status": {
            "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": "2025-01-01T00:00:00Z"}],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
            "capacity": {"cpu": "96", "memory": "1Ti", "amd.com/gpu": "8", "pods": "110"},
            "allocatable": {"cpu": "95500m", "memory": "1000Gi", "amd.com/gpu": "7"},
            "nodeInfo": {
                "kubeletVersion": "v1.31.0",
                "containerRuntimeVersion": "containerd://1.7.2",
                "kernelVersion": "6.8.0",
                "osImage": "Ubuntu 24.04",
            },
        },
    }
    event = translator.node(node, change=ChangeType.ADDED, at=AT)
    assert (event.ready, event.schedulable, event.taints[0].key, event.addresses[0].address) == (
        True,
        False,
        "gpu",
        "10.0.0.1",
    )
    assert (event.cpu_capacity_milli, event.cpu_allocatable_milli) == (96_000, 95_500)
    assert (event.memory_capacity_bytes, event.memory_allocatable_bytes) == (1024**4, 1000 * 1024**3)
    assert (event.gpu_capacity, event.gpu_allocatable, event.gpus_allocatable) == (
        {"amd.com/gpu": 8},
        {"amd.com/gpu": 7},
        7,
    )
    assert (event.gpu_model, event.gpu_vendor) == ("AMD Instinct MI300X", "AMD")
    assert (event.kubelet_version, event.container_runtime_version, event.kernel_version, event.os_image) == (
        "v1.31.0",
        "containerd://1.7.2",
        "6.8.0",
        "Ubuntu 24.04",
    )
    assert event.resource_version == "42"


def test_pod_without_gpus_is_not_an_event(translator) -> None:
    assert (
        translator.pod(pod([container(requests={"cpu": "1"})]), change=ChangeType.ADDED, at=AT, parents={})
        is None
    )


def test_unschedulable_pod_carries_the_scheduler_reason_and_message(translator) -> None:
    message = "0/12 nodes are available: 12 Insufficient nvidia.com/gpu."
    obj = pod(
        [container(requests={"nvidia.com/gpu": "8", "cpu": "500m", "memory": "1Gi"})],
        conditions=[
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
                "lastTransitionTime": "2025-01-01T00:00:01Z",
            }
        ],
        qosClass="Burstable",
    )
    event = translator.pod(obj, change=ChangeType.ADDED, at=AT, parents={})
    assert (event.unschedulable_reason, event.unschedulable_message) == ("Unschedulable", message)
    assert (event.gpu_amount, event.node, event.scheduled_time, event.qos) == (8, None, None, "Burstable")
    assert (event.cpu_request_milli, event.memory_request_bytes) == (500, 1024**3)


def test_finished_pod_has_schedule_start_and_latest_container_termination(translator) -> None:
    obj = pod(
        [container("a", requests={"nvidia.com/gpu": "1"}), container("b")],
        phase="Failed",
        startTime="2025-01-01T00:00:05Z",
        conditions=[{"type": "PodScheduled", "status": "True", "lastTransitionTime": "2025-01-01T00:00:02Z"}],
        containerStatuses=[
            {
                "name": "a",
                "restartCount": 3,
                "state": {
                    "terminated": {"reason": "Error", "exitCode": 137, "finishedAt": "2025-01-01T01:00:00Z"}
                },
            },
            {
                "name": "b",
                "state": {
                    "terminated": {"reason": "Completed", "exitCode": 0, "finishedAt": "2025-01-01T01:00:09Z"}
                },
            },
        ],
    )
    obj["spec"]["nodeName"] = "n1"
    obj["metadata"]["deletionTimestamp"] = "2025-01-01T02:00:00Z"
    event = translator.pod(obj, change=ChangeType.MODIFIED, at=AT, parents={})
    assert event.scheduled_time == datetime(2025, 1, 1, 0, 0, 2, tzinfo=UTC)
    assert event.start_time == datetime(2025, 1, 1, 0, 0, 5, tzinfo=UTC)
    assert event.termination_time == datetime(2025, 1, 1, 1, 0, 9, tzinfo=UTC)
    assert event.deletion_time == datetime(2025, 1, 1, 2, 0, 0, tzinfo=UTC)
    first = event.containers[0]
    assert (first.state, first.reason, first.restart_count, first.exit_code, first.gpu_amount) == (
        "terminated",
        "Error",
        3,
        137,
        1,
    )


def test_pod_gpu_models_come_from_node_selector_and_required_affinity(translator) -> None:
    obj = pod([container(requests={"nvidia.com/gpu": "1"})])
    obj["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    obj["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": "nvidia.com/gpu.product",
                                "operator": "In",
                                "values": ["NVIDIA-A100-SXM4-80GB"],
                            }
                        ]
                    }
                ]
            }
        }
    }
    event = translator.pod(obj, change=ChangeType.ADDED, at=AT, parents={})
    assert event.gpu_models == ["NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"]


def test_owner_chain_follows_cached_parents_and_stops_on_a_cycle() -> None:
    deployment = OwnerReference(kind="Deployment", api_version="apps/v1", name="d", uid="d-uid")
    rs = OwnerReference(kind="ReplicaSet", api_version="apps/v1", name="rs", uid="rs-uid")
    obj = pod([])
    assert owner_chain(obj, {"rs-uid": deployment}) == [rs, deployment]
    assert owner_chain(obj, {"rs-uid": deployment, "d-uid": rs}) == [rs, deployment]


def test_deleted_pod_event_has_a_deletion_time_and_its_own_id(translator) -> None:
    obj = pod([container(requests={"nvidia.com/gpu": "1"})])
    added = translator.pod(obj, change=ChangeType.ADDED, at=AT, parents={})
    deleted = translator.pod(obj, change=ChangeType.DELETED, at=AT, parents={})
    assert (deleted.type, deleted.deletion_time) == (ChangeType.DELETED, AT)
    assert deleted.event_id != added.event_id
    assert added.event_id == translator.pod(obj, change=ChangeType.ADDED, at=AT, parents={}).event_id


def template(gpus: str) -> dict:
    return {"spec": {"containers": [container(requests={"nvidia.com/gpu": gpus})]}}


@pytest.mark.parametrize(
    ("resource", "spec", "status", "gpu_request", "replicas", "state"),
    [
        (
            WORKLOADS["Deployment"],
            {"replicas": 3, "template": template("2")},
            {},
            6,
            3,
            WorkloadStatus.RUNNING,
        ),
        (
            WORKLOADS["Job"],
            {"parallelism": 4, "template": template("1")},
            {"conditions": [{"type": "Complete", "status": "True"}]},
            4,
            4,
            WorkloadStatus.DONE,
        ),
        (
            WORKLOADS["CronJob"],
            {"jobTemplate": {"spec": {"parallelism": 2, "template": template("1")}}},
            {},
            2,
            2,
            WorkloadStatus.RUNNING,
        ),
        (
            WORKLOADS["DaemonSet"],
            {"template": template("1")},
            {"desiredNumberScheduled": 5},
            5,
            5,
            WorkloadStatus.RUNNING,
        ),
        (
            PYTORCHJOB,
            {
                "pytorchReplicaSpecs": {
                    "Master": {"replicas": 1, "template": template("8")},
                    "Worker": {"replicas": 3, "template": template("8")},
                }
            },
            {"conditions": [{"type": "Failed", "status": "True"}]},
            32,
            4,
            WorkloadStatus.FAILED,
        ),
    ],
)
def test_workload_gpu_request_is_template_amount_times_replicas(
    translator, resource, spec, status, gpu_request, replicas, state
) -> None:
    obj = {
        "metadata": {
            "name": "w",
            "namespace": "ml",
            "uid": "w-uid",
            "resourceVersion": "3",
            "creationTimestamp": "2025-01-01T00:00:00Z",
            "labels": {"team": "a"},
        },
        "spec": spec,
        "status": status,
    }
    event = translator.workload(resource, obj, change=ChangeType.ADDED, at=AT)
    assert (event.gpu_request, event.replicas, event.status) == (gpu_request, replicas, state)
    assert (event.group, event.version, event.kind, event.labels) == (
        resource.group,
        "v1",
        resource.kind,
        {"team": "a"},
    )
    gone = translator.workload(resource, obj, change=ChangeType.DELETED, at=AT)
    assert gone.status is WorkloadStatus.DELETED
