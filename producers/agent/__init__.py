"""The node agent: GPUs (amdsmi, NVML), RDMA ports (sysfs) and pod<->device mapping (kubelet).

One agent per node publishes one GpuSampleBatch per interval, DeviceInventory when it changes
(and every ``inventory_interval_s``), and ContainerEvents when a container gains or loses
devices. Records the broker does not acknowledge wait in a bounded on-disk spool.
"""

from producers.agent.building import build_agent, collectors_for
from producers.agent.events import NodeIdentity
from producers.agent.metrics import AgentMetrics
from producers.agent.running import NodeAgent
from producers.agent.settings import AgentSettings

__all__ = ["AgentMetrics", "AgentSettings", "NodeAgent", "NodeIdentity", "build_agent", "collectors_for"]
