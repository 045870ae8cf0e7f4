"""Live memory of the worker's state per processor, after a fleet's records, beside a baseline.

    python -m bench.worker_memory [--nodes 1250] [--seconds 20] [--cases idle,workloads,all]

On a private platform (noida-db broker), the fleet simulator publishes ``--seconds`` of
``--nodes`` nodes (8 GPUs each, a batch every 2 s). Then, per case, a worker runs in-process
from offset 0 over every input record of its processors, and once it has processed them all
(and a full collection), ``tracemalloc`` says how much Python memory it still holds: its
state, with the worker's own (clocks, decoder caches). ``all`` is every processor
`gpulens worker` runs by default, in one worker. The baseline is a plain consumer that keeps
the latest decoded record of each key of the same topics: the facts the state is made of, as
the models hold them. Figures are per GPU, so that they scale to a fleet (state grows with
GPUs, pods and nodes; the simulator's are in proportion). Prints, never asserts.
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import threading
import tracemalloc
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from bench.worker_throughput import input_count, publish_fleet
from gpulens.config import GPULensSettings as Settings
from gpulens.pipeline.operators import Operator, operators_for
from gpulens.pipeline.running import StreamWorker, WorkerOptions
from gpulens.pipeline.settings import PROCESSORS, PipelineSettings
from gpulens.platform import private_platform
from gpulens.schemas.kafka.topic_admin import create_topics
from gpulens.schemas.wire.codec import AvroCodec, registry_client
from gpulens.tuning import tune_for_throughput


def operators(case: str) -> list[Operator]:
    if case == "all":
        return operators_for(PipelineSettings())
    return operators_for(PipelineSettings.model_validate({"processors": (case,)}))  # checks the name


def held_by_worker(settings: Settings, codec: AvroCodec, case: str) -> int:
    """Bytes the worker of ``case`` holds once it processed every input record."""
    made = operators(case)
    expected = input_count(settings, made)
    gc.collect()
    tracemalloc.start()
    worker = StreamWorker(settings.kafka, codec, made, WorkerOptions(group_id=f"memory-{case}", idle_ms=500))
    try:
        while worker.processed < expected:
            worker.step()
        gc.collect()
        return tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
        stop = threading.Event()
        stop.set()
        worker.run(stop)  # commits and closes


def held_by_baseline(settings: Settings, codec: AvroCodec) -> int:
    """Bytes a plain consumer holds keeping the latest decoded record per key of every input."""
    made = operators("all")
    specs = {s.name: s for op in made for s in op.inputs}
    expected = input_count(settings, made)
    consumer = Consumer(
        settings.kafka.librdkafka(**{"group.id": "memory-baseline", "enable.auto.commit": False})
    )
    consumer.assign([TopicPartition(s.name, p, 0) for s in specs.values() for p in range(s.partitions)])
    gc.collect()
    tracemalloc.start()
    latest: dict[tuple[str, bytes | None], object] = {}
    seen = 0
    try:
        while seen < expected:
            for message in consumer.consume(10_000, 1.0):
                if message.error() is None:
                    topic = message.topic() or ""
                    latest[(topic, message.key())] = codec.decode(specs[topic], message.value() or b"")
                    seen += 1
        gc.collect()
        return tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
        consumer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1250, help="Simulated nodes (8 GPUs each).")
    parser.add_argument("--seconds", type=float, default=20.0, help="Simulated seconds.")
    parser.add_argument(
        "--cases",
        default=",".join((*PROCESSORS, "all")),
        help=f"Comma-separated processors ({', '.join(PROCESSORS)}) and/or 'all'; every one by default.",
    )
    args = parser.parse_args()
    gpus = args.nodes * 8
    tune_for_throughput()  # as `gpulens worker` does
    with tempfile.TemporaryDirectory() as tmp, private_platform(Path(tmp)) as settings:
        create_topics(settings.kafka)
        codec = AvroCodec(registry_client(settings.registry.url))
        print(f"... publishing {args.seconds:g} s of {args.nodes:,} nodes", flush=True)
        publish_fleet(settings, codec, args.nodes, args.seconds)
        rows = [("baseline: latest record per key", held_by_baseline(settings, codec))]
        for case in args.cases.split(","):
            print(f"... {case}", flush=True)
            rows.append((case, held_by_worker(settings, codec, case)))
    floor = rows[0][1]
    print(f"\n{args.nodes:,} nodes x 8 GPUs, {args.seconds:g} s; live Python memory after a full collection")
    print(f"{'case':<34} {'MB':>8} {'bytes/GPU':>10} {'x baseline':>11}")
    for name, held in rows:
        print(f"{name:<34} {held / 2**20:8.1f} {held / gpus:10,.0f} {held / floor:11.2f}")


if __name__ == "__main__":
    main()
