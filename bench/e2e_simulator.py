"""The simulator process of :mod:`bench.e2e_scale`: `gpulens simulate`'s run, with an exact start.

    python -m bench.e2e_simulator --config CFG --nodes N --start-ms MS --duration D --out FILE

The same library code as `gpulens simulate --speed 1` (:class:`ClusterSimulation`,
:func:`publish_simulation`, :class:`EventPublisher`, sample batches written by
:class:`SampleBatchWriter`; ``--records`` builds and encodes each batch as a record instead, as
the simulator did before), with two differences a benchmark needs:

* the start is an exact instant chosen by the caller (the command rounds "now" down to the
  second and then spends its setup time, so its event times trail the wall clock by up to a
  few seconds). The cluster's start (every node joining, the running pods listed, which takes
  tens of seconds at 10,000+ nodes) is generated *before* that instant, then the process
  sleeps until it, so records go out when the wall clock reaches their event time;
* it counts what it published (records per topic, GPU samples per event time) and how late
  each instant's sample batches left (wall clock minus event time once the last of them was
  handed to the producer: every node samples at the same instant), and writes that as JSON to
  ``--out`` once every record is acknowledged.
"""

from __future__ import annotations

import argparse
import itertools
import json
import signal
import threading
import time
from collections.abc import Generator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType

from gpulens.config import load_settings
from gpulens.producers.publishing import DeliveryCallback, EventPublisher
from gpulens.producers.simulate import ClusterSimulation, SimulationSpec, publish_simulation
from gpulens.producers.simulate.batch_writing import SampleBatchWriter
from gpulens.producers.simulate.rounds import SampleRound
from gpulens.producers.simulate.simulating import Item
from gpulens.schemas.kafka.settings import KafkaSettings
from gpulens.schemas.model.topics import GPU_SAMPLES, TopicSpec
from gpulens.schemas.wire.codec import AvroCodec, registry_client
from gpulens.tuning import tune_for_throughput


class CountingPublisher(EventPublisher):
    """An :class:`EventPublisher` that counts what it queues, per topic."""

    def __init__(self, kafka: KafkaSettings, codec: AvroCodec) -> None:
        super().__init__(kafka, codec)
        self.by_topic: dict[str, int] = {}

    def produce(
        self, topic: str, key: bytes | None, value: bytes, *, on_delivery: DeliveryCallback | None = None
    ) -> None:
        super().produce(topic, key, value, on_delivery=on_delivery)
        self.by_topic[topic] = self.by_topic.get(topic, 0) + 1

    def produce_many(self, topic: str, keys: Sequence[bytes | None], values: Sequence[bytes]) -> None:
        super().produce_many(topic, keys, values)
        self.by_topic[topic] = self.by_topic.get(topic, 0) + len(values)


class PrimedSimulation(ClusterSimulation):
    """A simulation whose start (nodes joining, warm-up pods) is generated ahead of time, and
    that notes when each instant's samples were published."""

    def __init__(self, spec: SimulationSpec) -> None:
        super().__init__(spec)
        self.samples_by_ms: dict[int, int] = {}
        self.late_ms: list[tuple[int, int, int]] = []
        """(event time ms, ms late, samples) per instant."""

    def prime(self) -> None:
        """Generate up to the first record now, so that :meth:`stream` begins at once."""
        self._primed = super().stream()
        self._first = next(self._primed)

    def stream(self) -> Generator[tuple[TopicSpec, Item], None, None]:
        for topic, item in itertools.chain([self._first], self._primed):
            yield topic, item
            if isinstance(item, SampleRound):  # back here once the publisher has queued all of it
                at, samples = item.at_ms, item.samples
                self.samples_by_ms[at] = self.samples_by_ms.get(at, 0) + samples
                self.late_ms.append((at, round(time.time() * 1000) - at, samples))


def fleet_arguments(description: str) -> argparse.ArgumentParser:
    """The options of a process that publishes a simulated fleet from an exact start."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument(
        "--start-ms", type=int, required=True, help="Event time of the start, ms since epoch."
    )
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--seed", type=int, default=0)
    return parser


def fleet_spec(args: argparse.Namespace) -> SimulationSpec:
    """The simulation :func:`fleet_arguments` asked for."""
    return SimulationSpec(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        interval_s=args.interval,
        start=datetime.fromtimestamp(args.start_ms / 1000, UTC),
        duration_s=args.duration,
        cluster=args.cluster,
        seed=args.seed,
    )


def stop_on_signals() -> threading.Event:
    """An event SIGTERM and SIGINT set instead of ending the process."""
    stop = threading.Event()

    def _stop(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    return stop


def main() -> None:
    parser = fleet_arguments(__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--records", action="store_true", help="Build and encode each sample batch as a record (slower)."
    )
    args = parser.parse_args()

    settings = load_settings(args.config)
    tune_for_throughput()  # as `gpulens simulate` does
    codec = AvroCodec(registry_client(settings.registry.url))
    publisher = CountingPublisher(settings.kafka, codec)
    writer = None if args.records else SampleBatchWriter(codec.schema_id(GPU_SAMPLES))
    spec = fleet_spec(args)
    stop = stop_on_signals()
    began = time.time()
    simulation = PrimedSimulation(spec)
    simulation.prime()
    primed_s = time.time() - began
    wait = args.start_ms / 1000 - time.time()
    if wait > 0:
        stop.wait(wait)
    final = publish_simulation(simulation, publisher, speed=1.0, stop=stop, writer=writer, freeze=True)
    publisher.close()
    args.out.write_text(
        json.dumps(
            {
                "start_ms": args.start_ms,
                "primed_s": primed_s,
                "prime_overrun_s": max(0.0, -wait),
                "records": final.records,
                "elapsed_s": final.elapsed_s,
                "by_topic": publisher.by_topic,
                "samples": sum(simulation.samples_by_ms.values()),
                "samples_by_ms": {str(k): v for k, v in sorted(simulation.samples_by_ms.items())},
                "late_ms": simulation.late_ms,
                "stopped": stop.is_set(),
            }
        )
    )


if __name__ == "__main__":
    main()
