"""One realistic, fully populated record of every topic (an MI300X node running a PyTorchJob pod).

Used by ``gpulens smoke`` to check a platform end to end, and by the tests as the record
every schema must round-trip. Values follow what amdsmi, the kubelet and the API server
report on such a node.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpulens.schemas.model.ids import event_id
from gpulens.schemas.model.models import (
    Address,
    ChangeType,
    ContainerEvent,
    ContainerRuntimeState,
    ContainerState,
    DeviceAssignment,
    DeviceInventory,
    DeviceKind,
    Event,
    GpuDevice,
    GpuHealthEvent,
    GpuSample,
    GpuSampleBatch,
    NodeEvent,
    OwnerReference,
    PodCondition,
    PodEvent,
    RdmaDevice,
    StorageEvent,
    Taint,
    WorkloadEvent,
    WorkloadStatus,
)
from gpulens.schemas.model.topics import (
    CONTAINERS,
    DEVICE_INVENTORY,
    GPU_HEALTH,
    GPU_SAMPLES,
    NODES,
    PODS,
    STORAGE,
    WORKLOADS,
    TopicSpec,
)

NODE = "gpu-node-07"
POD_UID = "5f0c3a1e-8d2b-4b8e-9a51-2c7d3e9f1a44"
JOB_UID = "c1a9e2f4-1b7d-4e3a-8f60-7d2e5b9c0a11"


def example_events(
    cluster: str = "smoke", source: str = "smoke", at: datetime | None = None
) -> dict[TopicSpec, Event]:
    """One event per event topic, all about the same node, pod and workload."""
    t = (at or datetime(2026, 11, 1, 12, 0, tzinfo=UTC)).astimezone(UTC)

    def eid(kind: str) -> str:
        return event_id(cluster, source, kind, t.isoformat())

    gpus = [
        GpuDevice(
            device_id=f"0x{0x2F1B7C0E90000000 + i:x}",
            index=i,
            vendor="AMD",
            model="AMD Instinct MI300X",
            uuid=f"ff-{i:02d}-74a1-0000-1002-00000000000{i}",
            serial=f"692251001{i}",
            pci_vendor_id="0x1002",
            pci_device_id="0x74a1",
            bdf=f"0000:{0x0C + 0x10 * i:02x}:00.0",
            numa_node=0 if i < 4 else 1,
            vram_total_bytes=192 * 1024**3,
            vbios_version="113-M3000100-102",
            driver_version="6.8.5",
            firmware_version="MEC 177",
        )
        for i in range(2)
    ]
    pod_owners = [
        OwnerReference(kind="PyTorchJob", api_version="kubeflow.org/v1", name="llama-70b-sft", uid=JOB_UID)
    ]
    return {
        NODES: NodeEvent(
            event_id=eid("node"),
            cluster=cluster,
            event_time=t,
            source=source,
            type=ChangeType.ADDED,
            node=NODE,
            uid="0d6f5c2a-0000-4000-8000-000000000007",
            ready=True,
            schedulable=True,
            taints=[Taint(key="amd.com/gpu", value="present", effect="NoSchedule")],
            addresses=[Address(type="InternalIP", address="10.0.3.17")],
            labels={"amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM"},
            cpu_capacity_milli=192_000,
            cpu_allocatable_milli=190_000,
            memory_capacity_bytes=2_164_000_000_000,
            memory_allocatable_bytes=2_100_000_000_000,
            gpu_capacity={"amd.com/gpu": 8.0},
            gpu_allocatable={"amd.com/gpu": 8.0},
            gpu_model="AMD Instinct MI300X",
            gpu_vendor="AMD",
            kubelet_version="v1.30.4",
            container_runtime_version="containerd://1.7.20",
            kernel_version="5.15.0-119-generic",
            os_image="Ubuntu 22.04.4 LTS",
            resource_version="48151623",
        ),
        PODS: PodEvent(
            event_id=eid("pod"),
            cluster=cluster,
            event_time=t,
            source=source,
            type=ChangeType.MODIFIED,
            uid=POD_UID,
            namespace="training",
            name="llama-70b-sft-worker-0",
            node=NODE,
            phase="Running",
            gpu_resources={"amd.com/gpu": 8.0},
            gpu_amount=8.0,
            gpu_models=["AMD Instinct MI300X"],
            qos="Guaranteed",
            cpu_request_milli=96_000,
            memory_request_bytes=1_000_000_000_000,
            conditions=[
                PodCondition(
                    type="PodScheduled", status="True", last_transition_time=t - timedelta(seconds=40)
                )
            ],
            containers=[
                ContainerState(
                    name="pytorch",
                    image="rocm/pytorch:rocm6.2_ubuntu22.04_py3.10_pytorch_release_2.3.0",
                    gpu_amount=8.0,
                    state="running",
                    restart_count=0,
                )
            ],
            creation_time=t - timedelta(minutes=1),
            scheduled_time=t - timedelta(seconds=40),
            start_time=t - timedelta(seconds=35),
            labels={"training.kubeflow.org/job-name": "llama-70b-sft"},
            ip="10.244.7.12",
            owners=pod_owners,
            resource_version="48151700",
        ),
        WORKLOADS: WorkloadEvent(
            event_id=eid("workload"),
            cluster=cluster,
            event_time=t,
            source=source,
            type=ChangeType.ADDED,
            uid=JOB_UID,
            namespace="training",
            name="llama-70b-sft",
            group="kubeflow.org",
            version="v1",
            kind="PyTorchJob",
            gpu_request=16.0,
            replicas=2,
            status=WorkloadStatus.RUNNING,
            labels={"team": "llm"},
            creation_time=t - timedelta(minutes=2),
            resource_version="48151500",
        ),
        DEVICE_INVENTORY: DeviceInventory(
            event_id=eid("inventory"),
            cluster=cluster,
            event_time=t,
            source=source,
            node=NODE,
            gpus=gpus,
            rdma_devices=[
                RdmaDevice(
                    name="mlx5_0",
                    port=1,
                    state="ACTIVE",
                    physical_state="LinkUp",
                    link_layer="InfiniBand",
                    rate="400 Gb/sec (4X NDR)",
                    node_guid="b83f:d203:00a1:2c40",
                    firmware_version="28.39.1002",
                    netdev="ib0",
                )
            ],
        ),
        GPU_SAMPLES: GpuSampleBatch(
            event_id=eid("samples"),
            cluster=cluster,
            event_time=t,
            source=source,
            node=NODE,
            samples=[
                GpuSample(
                    device_id=gpu.device_id,
                    index=gpu.index,
                    utilization_pct=97.0 - gpu.index,
                    memory_used_bytes=171 * 1024**3,
                    memory_total_bytes=192 * 1024**3,
                    temperature_edge_c=None,  # MI300X reports no edge sensor
                    temperature_junction_c=71.0,
                    temperature_memory_c=58.0,
                    power_watts=688.0,
                    energy_joules=15_811_204.2,
                    sm_clock_mhz=2100.0,
                    memory_clock_mhz=1300.0,
                    pcie_bandwidth_mbps=1510.0,
                    ecc_correctable=0,
                    ecc_uncorrectable=0,
                )
                for gpu in gpus
            ],
        ),
        CONTAINERS: ContainerEvent(
            event_id=eid("container"),
            cluster=cluster,
            event_time=t,
            source=source,
            type=ChangeType.ADDED,
            node=NODE,
            pod_uid=POD_UID,
            pod_namespace="training",
            pod_name="llama-70b-sft-worker-0",
            container_name="pytorch",
            container_id="containerd://9b1f0c2d",
            state=ContainerRuntimeState.RUNNING,
            devices=[
                *(
                    DeviceAssignment(resource_name="amd.com/gpu", device_id=g.bdf or "", kind=DeviceKind.GPU)
                    for g in gpus
                ),
                DeviceAssignment(resource_name="rdma/hca", device_id="mlx5_0", kind=DeviceKind.RDMA),
            ],
        ),
        STORAGE: StorageEvent(
            event_id=eid("storage"),
            cluster=cluster,
            event_time=t,
            source=source,
            type=ChangeType.MODIFIED,
            storage_kind="pvc",
            name="checkpoints",
            namespace="training",
            storage_class="lustre",
            mount_point="/mnt/checkpoints",
            capacity_bytes=100 * 1024**4,
            used_bytes=37 * 1024**4,
            available_bytes=63 * 1024**4,
            labels={"team": "llm"},
        ),
        GPU_HEALTH: GpuHealthEvent(
            event_id=eid("gpu-health"),
            cluster=cluster,
            event_time=t,
            source=source,
            node=NODE,
            device_id=gpus[1].device_id,
            index=1,
            vendor="AMD",
            healthy=False,
            conditions=["ras-uncorrectable.umc"],
            cause="counters",
            counters={
                "correctable_count": 12,
                "uncorrectable_count": 1,
                "deferred_count": 1,
                "umc.correctable_count": 12,
                "umc.uncorrectable_count": 1,
                "umc.deferred_count": 1,
            },
            message=f"GPU {gpus[1].device_id} error counters; unhealthy: ras-uncorrectable.umc",
        ),
    }
