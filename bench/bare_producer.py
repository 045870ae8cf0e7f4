"""The floor under the simulator's cost: pre-built GpuSampleBatch bytes produced at real time.

    python -m bench.bare_producer --config CFG --nodes N --start-ms MS --duration D --cluster C

Each node's first batch is written once (:class:`SampleBatchWriter`); then, every interval from
``--start-ms``, the same bytes of every node go to a plain confluent-kafka ``Producer`` with the
settings :class:`EventPublisher` uses (idempotent, ``linger.ms`` 20), without delivery callbacks.
What this process spends is what moving the fleet's bytes through the client costs, whatever
generates them (:mod:`bench.simulate_cost` runs it beside the simulator). SIGTERM ends it early.
"""

from __future__ import annotations

import time

from confluent_kafka import Producer

from bench.e2e_simulator import fleet_arguments, fleet_spec, stop_on_signals
from gpulens.config import load_settings
from gpulens.producers.simulate import ClusterSimulation
from gpulens.producers.simulate.batch_writing import SampleBatchWriter
from gpulens.producers.simulate.rounds import SampleRound
from gpulens.schemas.model.topics import GPU_SAMPLES
from gpulens.schemas.wire.codec import AvroCodec, registry_client


def main() -> None:
    args = fleet_arguments(__doc__.splitlines()[0]).parse_args()

    settings = load_settings(args.config)
    codec = AvroCodec(registry_client(settings.registry.url))
    writer = SampleBatchWriter(codec.schema_id(GPU_SAMPLES))
    first = next(
        item for _, item in ClusterSimulation(fleet_spec(args)).stream() if isinstance(item, SampleRound)
    )
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
    stop = stop_on_signals()
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
