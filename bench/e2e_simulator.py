"""The simulator process of :mod:`bench.e2e_scale`: `gpulens simulate`'s run, with an exact start.

    python -m bench.e2e_simulator --config CFG --nodes N --start-ms MS --duration D --out FILE

The same library code as `gpulens simulate --speed 1` (:class:`ClusterSimulation`,
:func:`publish_simulation`, :class:`EventPublisher`), with two differences a benchmark needs:

* the start is an exact instant chosen by the caller (the command rounds "now" down to the
  second and then spends its setup time, so its event times trail the wall clock by up to a
  few seconds). The cluster's start (every node joining, the running pods listed, which takes
  tens of seconds at 10,000+ nodes) is generated *before* that instant, then the process
  sleeps until it, so records go out when the wall clock reaches their event time;
* it counts what it published (records per topic, GPU samples per event time) and how late
  each sample batch left (wall clock minus event time when handed to the producer), and
  writes that as JSON to ``--out`` once every record is acknowledged.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
import time
from collections.abc import Generator
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType

from gpulens.config import load_settings
from producers.publishing import EventPublisher
from producers.simulate import ClusterSimulation, SimulationSpec, publish_simulation
from producers.simulate.specs import to_ms
from schemas.codec import AvroCodec, registry_client
from schemas.models import Event, GpuSampleBatch
from schemas.settings import KafkaSettings
from schemas.topics import TopicSpec


class CountingPublisher(EventPublisher):
    """An :class:`EventPublisher` that counts what it queues and how late sample batches are."""

    def __init__(self, kafka: KafkaSettings, codec: AvroCodec) -> None:
        super().__init__(kafka, codec)
        self.by_topic: dict[str, int] = {}
        self.samples_by_ms: dict[int, int] = {}
        self.late_ms: list[tuple[int, int, int]] = []
        """(event time ms, ms late, samples) per GpuSampleBatch."""

    def publish(self, topic: TopicSpec, event: Event) -> None:
        super().publish(topic, event)
        self.by_topic[topic.name] = self.by_topic.get(topic.name, 0) + 1
        if isinstance(event, GpuSampleBatch):
            at = to_ms(event.event_time)
            self.samples_by_ms[at] = self.samples_by_ms.get(at, 0) + len(event.samples)
            self.late_ms.append((at, round(time.time() * 1000) - at, len(event.samples)))


class PrimedSimulation(ClusterSimulation):
    """A simulation whose start (nodes joining, warm-up pods) is generated ahead of time."""

    def prime(self) -> None:
        """Generate up to the first record now, so that :meth:`events` begins at once."""
        self._primed = super().events()
        self._first = next(self._primed)

    def events(self) -> Generator[tuple[TopicSpec, Event], None, None]:
        yield self._first
        yield from self._primed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    settings = load_settings(args.config)
    publisher = CountingPublisher(settings.kafka, AvroCodec(registry_client(settings.registry.url)))
    spec = SimulationSpec(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        interval_s=args.interval,
        start=datetime.fromtimestamp(args.start_ms / 1000, UTC),
        duration_s=args.duration,
        cluster=args.cluster,
        seed=args.seed,
    )
    stop = threading.Event()

    def _stop(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    began = time.time()
    simulation = PrimedSimulation(spec)
    simulation.prime()
    primed_s = time.time() - began
    wait = args.start_ms / 1000 - time.time()
    if wait > 0:
        stop.wait(wait)
    final = publish_simulation(simulation, publisher, speed=1.0, stop=stop)
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
                "samples": sum(publisher.samples_by_ms.values()),
                "samples_by_ms": {str(k): v for k, v in sorted(publisher.samples_by_ms.items())},
                "late_ms": publisher.late_ms,
                "stopped": stop.is_set(),
            }
        )
    )


if __name__ == "__main__":
    main()
