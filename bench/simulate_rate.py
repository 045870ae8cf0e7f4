"""Rate of the scale simulator: records/s it generates, and sustains into the broker, unpaced.

    python -m bench.simulate_rate [--sim-seconds 30]

For a few cluster sizes (G = 8 GPUs per node, a sample every 2 s): the simulation alone
(generate/s; GPU samples by column, as `gpulens simulate` makes them), then published at
--speed 0 as `gpulens simulate` does (sample batches written by column, the other records
through Avro and the registry) to the broker
(publish/s, acknowledged), and what that means: GPU samples/s, and how many times real time
the size can run (x real time; below 1 the size cannot keep pace on this machine; the start,
where every node joins and the running pods are listed, is included). Starts a
private platform (free ports, temporary state); never asserts, only prints.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from gpulens.platform import private_platform
from gpulens.producers.publishing import EventPublisher
from gpulens.producers.simulate import ClusterSimulation, SimulationSpec, publish_simulation
from gpulens.producers.simulate.batch_writing import SampleBatchWriter
from gpulens.producers.simulate.rounds import SampleRound
from gpulens.schemas.kafka.topic_admin import create_topics
from gpulens.schemas.model.topics import GPU_SAMPLES
from gpulens.schemas.wire.codec import AvroCodec, registry_client

SIZES = ((125, 8, 2.0), (500, 8, 2.0), (1250, 8, 2.0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sim-seconds", type=float, default=30.0, help="Simulated seconds per size.")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp, private_platform(Path(tmp)) as settings:
        create_topics(settings.kafka)
        codec = AvroCodec(registry_client(settings.registry.url))
        for nodes, gpus, interval in SIZES:
            spec = SimulationSpec(
                nodes=nodes,
                gpus_per_node=gpus,
                interval_s=interval,
                start=datetime(2025, 1, 1, tzinfo=UTC),
                duration_s=args.sim_seconds,
                cluster=f"bench-{nodes}",
            )
            records = samples = 0
            start = time.perf_counter()
            for _, item in ClusterSimulation(spec).stream():  # streamed, as a run does: nothing kept
                records += len(item.nodes) if isinstance(item, SampleRound) else 1
                samples += item.samples if isinstance(item, SampleRound) else 0
            generated = time.perf_counter() - start
            publisher = EventPublisher(settings.kafka, codec)
            writer = SampleBatchWriter(codec.schema_id(GPU_SAMPLES))
            final = publish_simulation(ClusterSimulation(spec), publisher, speed=0, writer=writer)
            del publisher  # gone before the broker stops: no disconnect noise at exit
            rows.append(
                (spec, records, records / generated, final.rate, samples / final.elapsed_s,
                 args.sim_seconds / final.elapsed_s)
            )  # fmt: skip
    print(f"\n{'nodes x GPUs @ interval':<24} {'records':>8} {'generate/s':>11} {'publish/s':>10} "
          f"{'GPU samples/s':>14} {'x real time':>12}   (steady state needs ~records/s)")  # fmt: skip
    for spec, count, generate_rate, publish_rate, sample_rate, factor in rows:
        size = f"{spec.nodes:,} x {spec.gpus_per_node} @ {spec.interval_s:g} s"
        print(
            f"{size:<24} {count:>8,} {generate_rate:>11,.0f} {publish_rate:>10,.0f} {sample_rate:>14,.0f} "
            f"{factor:>12.1f}   ({spec.records_per_s:,.0f}/s)"
        )


if __name__ == "__main__":
    main()
