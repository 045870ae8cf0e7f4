-- Latest state: one row per entity, the newest observation wins. Every table of these
-- migrations keeps the hashes of its last 1000 inserts (non_replicated_deduplication_window)
-- so that a retried insert with the same insert_deduplication_token is stored once.
-- version = event_time in ms * 2^64 + Kafka offset: the newer event wins, and of two events
-- at the same millisecond the later one on the entity's partition. Read with FINAL.

CREATE TABLE IF NOT EXISTS nodes
(
    cluster LowCardinality(String) COMMENT 'Cluster name.',
    node LowCardinality(String) COMMENT 'Node name.',
    uid Nullable(String) COMMENT 'Node object uid.',
    type LowCardinality(String) COMMENT 'ADDED, MODIFIED or DELETED: the last change seen.',
    ready Bool COMMENT 'The Ready condition is True.',
    schedulable Bool COMMENT 'Not cordoned.',
    taints Array(Tuple(key String, value Nullable(String), effect String)) COMMENT 'Node taints.',
    addresses Array(Tuple(type String, address String)) COMMENT 'Node addresses.',
    labels Map(String, String) COMMENT 'Node labels.',
    cpu_capacity_milli Nullable(Int64) COMMENT 'CPU capacity, millicores.',
    cpu_allocatable_milli Nullable(Int64) COMMENT 'Allocatable CPU, millicores.',
    memory_capacity_bytes Nullable(Int64) COMMENT 'Memory capacity, bytes.',
    memory_allocatable_bytes Nullable(Int64) COMMENT 'Allocatable memory, bytes.',
    gpu_capacity Map(LowCardinality(String), Float64) COMMENT 'Capacity per GPU resource name.',
    gpu_allocatable Map(LowCardinality(String), Float64) COMMENT 'Allocatable amount per GPU resource name.',
    gpus_allocatable Float64 COMMENT 'Sum of gpu_allocatable: GPUs this node offers to pods.',
    gpu_model LowCardinality(Nullable(String)) COMMENT 'GPU model from the node labels.',
    gpu_vendor LowCardinality(Nullable(String)) COMMENT 'AMD or NVIDIA.',
    kubelet_version LowCardinality(Nullable(String)) COMMENT 'Kubelet version.',
    container_runtime_version LowCardinality(Nullable(String)) COMMENT 'Container runtime.',
    kernel_version LowCardinality(Nullable(String)) COMMENT 'Kernel version.',
    os_image LowCardinality(Nullable(String)) COMMENT 'OS image.',
    resource_version Nullable(String) COMMENT 'Kubernetes resourceVersion seen.',
    event_id String COMMENT 'Deterministic id of the observation.',
    event_time DateTime64(3, 'UTC') COMMENT 'When the change happened (event time).',
    source LowCardinality(String) COMMENT 'What observed it.',
    version UInt128 COMMENT 'event_time ms * 2^64 + Kafka offset: the newest row wins.'
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (cluster, node)
SETTINGS non_replicated_deduplication_window = 1000
COMMENT 'Latest state of every node (from gpulens.nodes.v1); read with FINAL.';

CREATE TABLE IF NOT EXISTS pods
(
    cluster LowCardinality(String) COMMENT 'Cluster name.',
    uid String COMMENT 'Pod uid: the entity key.',
    namespace LowCardinality(String) COMMENT 'Namespace.',
    name String COMMENT 'Pod name.',
    node LowCardinality(Nullable(String)) COMMENT 'Node the pod is bound to; null while pending.',
    type LowCardinality(String) COMMENT 'ADDED, MODIFIED or DELETED: the last change seen.',
    phase LowCardinality(String) COMMENT 'Pending, Running, Succeeded, Failed or Unknown.',
    holds_gpus Bool COMMENT 'Bound, Running, not deleted and asking for GPUs (DESIGN.md).',
    gpu_resources Map(LowCardinality(String), Float64) COMMENT 'GPU amount per resource name.',
    gpu_amount Float64 COMMENT 'GPUs held (shares as fractions).',
    gpu_models Array(LowCardinality(String)) COMMENT 'GPU models the pod may run on (empty: any).',
    qos LowCardinality(Nullable(String)) COMMENT 'QoS class or priority tier.',
    cpu_request_milli Nullable(Int64) COMMENT 'CPU requested, millicores.',
    memory_request_bytes Nullable(Int64) COMMENT 'Memory requested, bytes.',
    conditions Array(Tuple(
        type String, status String, reason Nullable(String), message Nullable(String),
        last_transition_time Nullable(DateTime64(3, 'UTC')))) COMMENT 'Pod conditions.',
    unschedulable_reason Nullable(String) COMMENT 'PodScheduled=False reason.',
    unschedulable_message Nullable(String) COMMENT 'Scheduler message.',
    containers Array(Tuple(
        name String, image Nullable(String), gpu_amount Float64, state Nullable(String),
        reason Nullable(String), restart_count UInt32, exit_code Nullable(Int32))) COMMENT 'Containers.',
    creation_time DateTime64(3, 'UTC') COMMENT 'metadata.creationTimestamp.',
    scheduled_time Nullable(DateTime64(3, 'UTC')) COMMENT 'When bound to a node.',
    start_time Nullable(DateTime64(3, 'UTC')) COMMENT 'status.startTime.',
    termination_time Nullable(DateTime64(3, 'UTC')) COMMENT 'When it finished.',
    deletion_time Nullable(DateTime64(3, 'UTC')) COMMENT 'When deleted.',
    labels Map(String, String) COMMENT 'Pod labels.',
    ip Nullable(String) COMMENT 'Pod IP.',
    owners Array(Tuple(kind String, api_version String, name String, uid String))
        COMMENT 'Owner chain, direct owner first, top workload last.',
    workload_uid Nullable(String) COMMENT 'uid of the top owner (owners[-1]), null for a bare pod.',
    resource_version Nullable(String) COMMENT 'Kubernetes resourceVersion seen.',
    event_id String COMMENT 'Deterministic id of the observation.',
    event_time DateTime64(3, 'UTC') COMMENT 'When the change happened (event time).',
    source LowCardinality(String) COMMENT 'What observed it.',
    version UInt128 COMMENT 'event_time ms * 2^64 + Kafka offset: the newest row wins.'
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (cluster, uid)
SETTINGS non_replicated_deduplication_window = 1000
COMMENT 'Latest state of every GPU pod (from gpulens.pods.v1); read with FINAL.';

CREATE TABLE IF NOT EXISTS workloads
(
    cluster LowCardinality(String) COMMENT 'Cluster name.',
    uid String COMMENT 'Workload uid: the entity key.',
    namespace LowCardinality(String) COMMENT 'Namespace.',
    name String COMMENT 'Name.',
    kind LowCardinality(String) COMMENT 'Deployment, Job, PyTorchJob, ...',
    api_group LowCardinality(String) COMMENT 'API group (empty for the core group).',
    api_version LowCardinality(String) COMMENT 'API version.',
    parent_uid Nullable(String) COMMENT 'Owner uid (ReplicaSet -> Deployment).',
    type LowCardinality(String) COMMENT 'ADDED, MODIFIED or DELETED: the last change seen.',
    status LowCardinality(String) COMMENT 'Running, Done, Failed or Deleted.',
    gpu_request Float64 COMMENT 'Template GPU amount x replicas/parallelism.',
    replicas Nullable(Int32) COMMENT 'Desired replicas or parallelism.',
    labels Map(String, String) COMMENT 'Labels.',
    creation_time Nullable(DateTime64(3, 'UTC')) COMMENT 'metadata.creationTimestamp.',
    resource_version Nullable(String) COMMENT 'Kubernetes resourceVersion seen.',
    event_id String COMMENT 'Deterministic id of the observation.',
    event_time DateTime64(3, 'UTC') COMMENT 'When the change happened (event time).',
    source LowCardinality(String) COMMENT 'What observed it.',
    version UInt128 COMMENT 'event_time ms * 2^64 + Kafka offset: the newest row wins.'
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (cluster, uid)
SETTINGS non_replicated_deduplication_window = 1000
COMMENT 'Latest state of every workload (from gpulens.workloads.v1); read with FINAL.';

CREATE TABLE IF NOT EXISTS containers
(
    cluster LowCardinality(String) COMMENT 'Cluster name.',
    node LowCardinality(String) COMMENT 'Node name.',
    pod_namespace LowCardinality(String) COMMENT 'Pod namespace.',
    pod_name String COMMENT 'Pod name.',
    container_name String COMMENT 'Container name.',
    pod_uid Nullable(String) COMMENT 'Pod uid, when known.',
    container_id Nullable(String) COMMENT 'Runtime container id.',
    type LowCardinality(String) COMMENT 'ADDED, MODIFIED or DELETED: the last change seen.',
    devices Array(Tuple(resource_name String, device_id String, kind String)) COMMENT 'Devices held.',
    event_id String COMMENT 'Deterministic id of the observation.',
    event_time DateTime64(3, 'UTC') COMMENT 'When the change happened (event time).',
    source LowCardinality(String) COMMENT 'What observed it.',
    version UInt128 COMMENT 'event_time ms * 2^64 + Kafka offset: the newest row wins.'
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (cluster, node, pod_namespace, pod_name, container_name)
SETTINGS non_replicated_deduplication_window = 1000
COMMENT 'Latest state of every container and the devices it holds (from gpulens.containers.v1).';

CREATE TABLE IF NOT EXISTS container_devices
(
    cluster LowCardinality(String) COMMENT 'Cluster name.',
    node LowCardinality(String) COMMENT 'Node name.',
    resource_name LowCardinality(String) COMMENT 'Device plugin resource, e.g. amd.com/gpu.',
    device_id String COMMENT 'Device id as the device plugin reports it.',
    kind LowCardinality(String) COMMENT 'GPU, RDMA or OTHER.',
    pod_namespace LowCardinality(String) COMMENT 'Pod namespace.',
    pod_name String COMMENT 'Pod name.',
    container_name String COMMENT 'Container name.',
    pod_uid Nullable(String) COMMENT 'Pod uid, when known.',
    container_id Nullable(String) COMMENT 'Runtime container id.',
    type LowCardinality(String) COMMENT 'Type of the container event that listed it (DELETED: released).',
    event_id String COMMENT 'Deterministic id of the container event.',
    event_time DateTime64(3, 'UTC') COMMENT 'When the change happened (event time).',
    source LowCardinality(String) COMMENT 'What observed it.',
    version UInt128 COMMENT 'event_time ms * 2^64 + Kafka offset: the newest row wins.'
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (cluster, node, resource_name, device_id, pod_namespace, pod_name, container_name)
SETTINGS non_replicated_deduplication_window = 1000
COMMENT 'Which container holds which device: one row per (device, container), newest wins.';

CREATE TABLE IF NOT EXISTS gpu_devices
(
    cluster LowCardinality(String) COMMENT 'Cluster name.',
    node LowCardinality(String) COMMENT 'Node name.',
    device_id String COMMENT 'Stable id: UUID or serial; MIG devices have their own.',
    gpu_index UInt16 COMMENT 'Index on the node as the driver numbers it.',
    vendor LowCardinality(String) COMMENT 'AMD or NVIDIA.',
    model LowCardinality(String) COMMENT 'Market name, e.g. AMD Instinct MI300X.',
    uuid Nullable(String) COMMENT 'Driver UUID.',
    serial Nullable(String) COMMENT 'Board serial number.',
    pci_vendor_id LowCardinality(Nullable(String)) COMMENT 'PCI vendor id.',
    pci_device_id LowCardinality(Nullable(String)) COMMENT 'PCI device id.',
    bdf Nullable(String) COMMENT 'PCI bus address.',
    numa_node Nullable(Int16) COMMENT 'NUMA node.',
    vram_total_bytes Nullable(Int64) COMMENT 'VRAM size, bytes.',
    vbios_version LowCardinality(Nullable(String)) COMMENT 'VBIOS version.',
    driver_version LowCardinality(Nullable(String)) COMMENT 'Driver version.',
    firmware_version LowCardinality(Nullable(String)) COMMENT 'Main firmware version.',
    parent_device_id Nullable(String) COMMENT 'Parent GPU of a MIG device or partition.',
    gpu_partition LowCardinality(Nullable(String)) COMMENT 'MIG profile or compute partition.',
    event_id String COMMENT 'Id of the DeviceInventory that listed it.',
    event_time DateTime64(3, 'UTC') COMMENT 'When that inventory was taken.',
    source LowCardinality(String) COMMENT 'What observed it.',
    version UInt128 COMMENT 'event_time ms * 2^64 + Kafka offset: the newest row wins.'
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (cluster, node, device_id)
SETTINGS non_replicated_deduplication_window = 1000
COMMENT 'Every GPU ever inventoried, as last seen (from gpulens.devices.inventory.v1).';

CREATE TABLE IF NOT EXISTS rdma_devices
(
    cluster LowCardinality(String) COMMENT 'Cluster name.',
    node LowCardinality(String) COMMENT 'Node name.',
    name LowCardinality(String) COMMENT 'Device name, e.g. mlx5_0.',
    port UInt16 COMMENT 'Port number.',
    state LowCardinality(Nullable(String)) COMMENT 'Port state, e.g. ACTIVE.',
    physical_state LowCardinality(Nullable(String)) COMMENT 'Physical state, e.g. LinkUp.',
    link_layer LowCardinality(Nullable(String)) COMMENT 'InfiniBand or Ethernet.',
    rate LowCardinality(Nullable(String)) COMMENT 'Link rate.',
    node_guid Nullable(String) COMMENT 'Node GUID.',
    firmware_version LowCardinality(Nullable(String)) COMMENT 'Firmware version.',
    netdev Nullable(String) COMMENT 'Associated network interface.',
    event_id String COMMENT 'Id of the DeviceInventory that listed it.',
    event_time DateTime64(3, 'UTC') COMMENT 'When that inventory was taken.',
    source LowCardinality(String) COMMENT 'What observed it.',
    version UInt128 COMMENT 'event_time ms * 2^64 + Kafka offset: the newest row wins.'
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (cluster, node, name, port)
SETTINGS non_replicated_deduplication_window = 1000
COMMENT 'Every RDMA port ever inventoried, as last seen (from gpulens.devices.inventory.v1).';
