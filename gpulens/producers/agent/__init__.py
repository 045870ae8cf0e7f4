"""The node agent: GPUs (amdsmi, NVML), RDMA ports (sysfs), pod<->device mapping (kubelet) and
container lifecycle (containerd).

One agent per node publishes one GpuSampleBatch per interval, DeviceInventory when it changes
(and every ``inventory_interval_s``), and ContainerEvents when a container gains or loses
devices or containerd reports its lifecycle (created, running, OOM-killed, exited, deleted).
Records the broker does not acknowledge wait in a bounded on-disk spool.

Names load on first use (PEP 562): every GPULens process imports
``gpulens.producers.agent.settings`` for its configuration, and that must not load the agent's gRPC
stubs, spool and collectors with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpulens.schemas.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from gpulens.producers.agent.building import build_agent, collectors_for
    from gpulens.producers.agent.events import NodeIdentity
    from gpulens.producers.agent.metrics import AgentMetrics
    from gpulens.producers.agent.running import NodeAgent
    from gpulens.producers.agent.settings import AgentSettings

_EXPORTS: dict[str, str] = {
    "AgentMetrics": "metrics",
    "AgentSettings": "settings",
    "NodeAgent": "running",
    "NodeIdentity": "events",
    "build_agent": "building",
    "collectors_for": "building",
}
"""Public name -> the submodule defining it."""

__all__ = ["AgentMetrics", "AgentSettings", "NodeAgent", "NodeIdentity", "build_agent", "collectors_for"]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
