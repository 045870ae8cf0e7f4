"""One sampling instant of the whole fleet, by column: every Ready node's GpuSampleBatch at once.

The simulation samples 100,000 GPUs every couple of seconds; building a pydantic record per GPU
and encoding it in Python cost more than a core. A round keeps the values as arrays, one entry
per sample, nodes one after another: :meth:`SampleRound.batches` turns it into the records
(what consumers of :meth:`ClusterSimulation.events` see), and
:class:`gpulens.producers.simulate.batch_writing.SampleBatchWriter` writes their exact wire bytes
without building them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpulens.producers.simulate.specs import from_ms
from gpulens.schemas.model.models import GpuSample, GpuSampleBatch

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True, eq=False)
class SampleRound:
    """The GpuSampleBatches of one instant: node ``k``'s samples are ``starts[k]:starts[k + 1]``."""

    cluster: str
    source: str
    at_ms: int
    nodes: list[str]
    """Reporting nodes (present and Ready), in the simulation's node order."""
    event_ids: list[str]
    """Each node's batch event id."""
    starts: Ints
    """``len(nodes) + 1`` offsets into the sample columns."""
    slots: Ints
    """A stable number per GPU of the fleet: the same GPU has the same slot in every round."""
    device_ids: list[str]
    """GpuSample.device_id of every slot (indexed by slot, not by sample)."""
    ints: dict[str, Ints]
    """GpuSample's integer fields other than ``index`` (never null here)."""
    floats: dict[str, Floats | None]
    """GpuSample's float fields; None where the model reports no such value (null in every sample)."""
    index: Ints
    """GpuSample.index."""

    @property
    def samples(self) -> int:
        return len(self.slots)

    def batches(self) -> list[GpuSampleBatch]:
        """The round as records (validated; what the wire bytes decode to)."""
        at = from_ms(self.at_ms)
        ints = {name: column.tolist() for name, column in self.ints.items()}
        floats = {name: column.tolist() for name, column in self.floats.items() if column is not None}
        nulls = {name: None for name, column in self.floats.items() if column is None}
        index, starts, devices = self.index.tolist(), self.starts.tolist(), self.device_ids
        samples = [
            GpuSample(
                device_id=devices[slot],
                index=index[i],
                **{name: values[i] for name, values in ints.items()},
                **{name: values[i] for name, values in floats.items()},
                **nulls,
            )
            for i, slot in enumerate(self.slots.tolist())
        ]
        return [
            GpuSampleBatch(
                event_id=self.event_ids[k],
                cluster=self.cluster,
                event_time=at,
                source=self.source,
                node=node,
                samples=samples[starts[k] : starts[k + 1]],
            )
            for k, node in enumerate(self.nodes)
        ]
