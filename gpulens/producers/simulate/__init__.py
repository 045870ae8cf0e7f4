"""The scale simulator: a synthetic GPU cluster publishing what the live producers would.

specs        what a simulation is: size, load, GPU models, workload mix, churn (definitions)
state        the cluster's nodes, GPUs, workloads and pods (plain data)
scheduling   best-fit placement of pods on free GPUs
sampling     what the fleet's GPUs report each interval, from the pods holding them (by column)
rounds       one instant's GPU samples of every node, as columns; the GpuSampleBatches they stand for
records      state -> NodeEvent, DeviceInventory, PodEvent, ... (the real producers' shapes)
simulating   the discrete-event simulation: arrivals, lifecycles, churn, samples, in event time
batch_writing  a round's GpuSampleBatches as wire bytes, written by column (the codec's exact bytes)
pacing       publishing it at wall-clock speed (or N times faster), ending with a final watermark
"""

from gpulens.producers.simulate.exceptions import SimulationError
from gpulens.producers.simulate.pacing import Progress, publish_simulation
from gpulens.producers.simulate.simulating import Census, ClusterSimulation
from gpulens.producers.simulate.specs import (
    GPU_MODELS,
    SOURCE,
    ChurnRates,
    GpuModel,
    SimulationSpec,
    WorkloadProfile,
)

__all__ = [
    "GPU_MODELS",
    "SOURCE",
    "Census",
    "ChurnRates",
    "ClusterSimulation",
    "GpuModel",
    "Progress",
    "SimulationError",
    "SimulationSpec",
    "WorkloadProfile",
    "publish_simulation",
]
