"""The floor under the simulator's cost: pre-built GpuSampleBatch bytes produced at real time.

    python -m bench.bare_producer --config CFG --nodes N --start-ms MS --duration D --cluster C

Each node's first batch is written once (:class:`SampleBatchWriter`); then, every interval from
``--start-ms``, the same bytes of every node go to a plain confluent-kafka ``Producer`` with the
settings :class:`EventPublisher` uses (idempotent, ``linger.ms`` 20), without delivery callbacks.
What this process spends is what moving the fleet's bytes through the client costs, whatever
generates them (:mod:`bench.simulate_cost` runs it beside the simulator). SIGTERM ends it early.
"""

from __future__ import annotations

import argparse
import signal
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType

from confluent_kafka import Producer

from gpulens.config import load_settings
from gpulens.producers.simulate import ClusterSimulation, SimulationSpec
from gpulens.producers.simulate.batch_writing import SampleBatchWriter
from gpulens.producers.simulate.rounds import SampleRound
from gpulens.schemas.model.topics import GPU_SAMPLES
from gpulens.schemas.wire.codec import AvroCodec, registry_client


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--start-ms", type=int, required=True)
    parser.add_argument("--cluster", required=True)
    args = parser.parse_args()

    settings = load_settings(args.config)
    codec = AvroCodec(registry_client(settings.registry.url))
    writer = SampleBatchWriter(codec.schema_id(GPU_SAMPLES))
    spec = SimulationSpec(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        interval_s=args.interval,
        start=datetime.fromtimestamp(args.start_ms / 1000, UTC),
        cluster=args.cluster,
    )
    first = next(item for _, item in ClusterSimulation(spec).stream() if isinstance(item, SampleRound))
    records = list(zip(*writer.write(first), strict=True))
    producer = Producer(
        settings.kafka.librdkafka(
            **{
                "enable.idempotence": True,
                "linger.ms": 20,
                "batch.num.messages": 10_000,
                "queue.buffering.max.messages": 500_000,
            }
        )
    )
    stop = threading.Event()

    def _stop(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    tick = 0
    while tick * args.interval < args.duration:
        wait = args.start_ms / 1000 + tick * args.interval - time.time()
        while wait > 0 and not stop.is_set():
            producer.poll(min(wait, 0.1))
            wait = args.start_ms / 1000 + tick * args.interval - time.time()
        if stop.is_set():
            break
        topic = GPU_SAMPLES.name
        for key, value in records:
            try:
                producer.produce(topic, value, key)
            except BufferError:
                producer.poll(0.05)
                producer.produce(topic, value, key)
            producer.poll(0)
        tick += 1
    producer.flush(60)


if __name__ == "__main__":
    main()
