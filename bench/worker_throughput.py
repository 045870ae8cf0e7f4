"""Stream-worker throughput per processor, beside a plain consumer baseline, per CPU-second.

    python -m bench.worker_throughput [--fleet-nodes 1250] [--fleet-seconds 120] [--skip-traces]
                                      [--cases five,idle] [--repeat 1]

Two data sets, each on a private platform of its own (noida-db broker on the same 2 cores):

* **traces**: both real traces (Alibaba v2023: 21.5k pod/node events; GenAI: 52.6k events,
  mostly one-GPU sample batches);
* **fleet**: the GPU-sample path at fleet scale, ``gpulens simulate``'s records for
  ``--fleet-nodes`` nodes of 8 GPUs sampled every 2 s over ``--fleet-seconds`` (the node
  agents' batches: one record per node and interval).

For each processor the worker runs in-process from offset 0 until it has processed every
input record, and a plain confluent-kafka consumer decodes the same records first (the floor
of any processor). The interpreter is tuned as `gpulens worker` tunes it
(:mod:`gpulens.tuning`). Figures are per wall second and per CPU-second of this process (its
librdkafka threads included; the broker is another process). With ``--repeat N`` each case
runs N times (the baseline too) and the least CPU is printed, with every run's samples per
CPU-second beside it: on this shared machine one run of the same code varied by up to ±10 %
(140k to 170k samples per CPU-second for the five, one commit, one hour).
Prints, never asserts.
"""

from __future__ import annotations

import argparse
import gc
import resource
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from gpulens.config import GPULensSettings as Settings
from gpulens.pipeline.operators import (
    AllocationOperator,
    Operator,
    operators_for,
)
from gpulens.pipeline.running import StreamWorker, WorkerOptions
from gpulens.pipeline.settings import PipelineSettings, Processor
from gpulens.pipeline.windows import TumblingWindows
from gpulens.platform import private_platform
from gpulens.producers.publishing import EventPublisher
from gpulens.producers.replay import alibaba_v2023, genai_duty
from gpulens.producers.replay.locating import traces_dir
from gpulens.producers.replay.pacing import replay
from gpulens.producers.simulate import ClusterSimulation, SimulationSpec, publish_simulation
from gpulens.schemas.kafka.topic_admin import create_topics
from gpulens.schemas.model.models import GpuSampleBatch
from gpulens.schemas.model.topics import GPU_SAMPLES
from gpulens.schemas.wire.codec import AvroCodec, registry_client
from gpulens.tuning import tune_for_throughput

HOUR = 3_600_000
Cases = dict[str, Callable[[], list[Operator]]]


@dataclass(frozen=True, slots=True)
class Measured:
    name: str
    records: int
    wall_s: float
    cpu_s: float
    samples: int = 0
    runs: tuple[float, ...] = ()
    """CPU seconds of every run, where the case ran more than once (this is the least)."""

    def line(self) -> str:
        per_cpu = self.records / max(self.cpu_s, 1e-9)
        samples = f"{self.samples / max(self.cpu_s, 1e-9):>12,.0f}" if self.samples else f"{'':>12}"
        each = ", ".join(f"{self.samples / cpu / 1000:.1f}k" for cpu in self.runs) if self.samples else ""
        return (
            f"{self.name:<40} {self.records:>9,} {self.records / self.wall_s:>10,.0f} "
            f"{per_cpu:>11,.0f} {samples}" + (f"  (runs: {each})" if len(self.runs) > 1 and each else "")
        )


def publish_traces(settings: Settings, codec: AvroCodec) -> None:
    traces = traces_dir()
    alibaba = alibaba_v2023.plan(
        alibaba_v2023.read_nodes(traces / "alibaba-gpu-v2023/openb_node_list_gpu_node.csv"),
        alibaba_v2023.read_pods(traces / "alibaba-gpu-v2023/openb_pod_list_default.csv"),
        cluster="alibaba",
        epoch=datetime(2023, 1, 1, tzinfo=UTC),
    )
    genai = genai_duty.plan(
        genai_duty.read_samples(traces / "alibaba-genai-2026/pod_gpu_duty_cycle_48pods.csv"), cluster="genai"
    )
    for events in (alibaba, genai):
        replay(events, EventPublisher(settings.kafka, codec))


def publish_fleet(settings: Settings, codec: AvroCodec, nodes: int, seconds: float) -> None:
    spec = SimulationSpec(
        nodes=nodes, gpus_per_node=8, interval_s=2.0, start=datetime(2025, 1, 1, tzinfo=UTC),
        duration_s=seconds, cluster="fleet",
    )  # fmt: skip
    publisher = EventPublisher(settings.kafka, codec)
    publish_simulation(ClusterSimulation(spec), publisher, speed=0)
    del publisher


def input_count(settings: Settings, operators: list[Operator]) -> int:
    probe = Consumer(settings.kafka.librdkafka(**{"group.id": "bench-probe"}))
    total = 0
    for spec in {s for op in operators for s in op.inputs}:
        for p in range(spec.partitions):
            total += probe.get_watermark_offsets(TopicPartition(spec.name, p), timeout=10)[1]
    probe.close()
    return total


def run_worker(settings: Settings, codec: AvroCodec, name: str, operators: list[Operator]) -> Measured:
    expected = input_count(settings, operators)
    worker = StreamWorker(
        settings.kafka, codec, operators, WorkerOptions(group_id=f"bench-{name}", idle_ms=500)
    )
    stop = threading.Event()
    wall, cpu = time.perf_counter(), time.process_time()
    while worker.processed < expected:
        worker.step()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    stop.set()
    worker.run(stop)
    return Measured(name, expected, wall, cpu)


def baseline(settings: Settings, codec: AvroCodec, operators: list[Operator]) -> Measured:
    """A plain consumer that only decodes the same input records (the floor of any processor)."""
    specs = {s.name: s for op in operators for s in op.inputs}
    expected = input_count(settings, operators)
    consumer = Consumer(
        settings.kafka.librdkafka(**{"group.id": "bench-baseline", "enable.auto.commit": False})
    )
    consumer.assign([TopicPartition(s.name, p, 0) for s in specs.values() for p in range(s.partitions)])
    seen = samples = 0
    wall, cpu = time.perf_counter(), time.process_time()
    while seen < expected:
        for message in consumer.consume(10_000, 1.0):
            if message.error() is None:
                record = codec.decode(specs[message.topic() or ""], message.value() or b"")
                samples += len(record.samples) if isinstance(record, GpuSampleBatch) else 0
                seen += 1
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    consumer.close()
    return Measured("  baseline: consume + decode", seen, wall, cpu, samples)


def measure(settings: Settings, codec: AvroCodec, cases: Cases, repeat: int) -> list[Measured]:
    rows = []
    for index, (name, make) in enumerate(cases.items()):
        print(f"... {name}", flush=True)
        floors, done = [], []
        for attempt in range(repeat):
            gc.collect()  # the publisher's and the previous run's leftovers are not this run's work
            operators = make()
            floors.append(baseline(settings, codec, operators))
            done.append(run_worker(settings, codec, f"{index}-{attempt}", operators))
        floor, best = min(floors, key=lambda m: m.cpu_s), min(done, key=lambda m: m.cpu_s)
        rows.append(floor)
        runs = tuple(m.cpu_s for m in done)
        rows.append(Measured(name, best.records, best.wall_s, best.cpu_s, floor.samples, runs))
    return rows


def chosen(*processors: Processor) -> Callable[[], list[Operator]]:
    """The operators of these processors as `gpulens worker` builds them, default settings."""
    return lambda: operators_for(PipelineSettings(processors=processors))


TRACE_CASES: Cases = {
    "allocation (30 s windows, per node)": lambda: [
        AllocationOperator(TumblingWindows(30_000), per_node=True)
    ],
    "allocation (1 h windows, cluster)": lambda: [AllocationOperator(TumblingWindows(HOUR), per_node=False)],
    "alerts": chosen("alerts"),
    "changelog": chosen("changelog"),
    "state": chosen("state"),
}


FLEET_CASES: Cases = {
    "alerts": chosen("alerts"),
    "workloads (30 s windows)": chosen("workloads"),
    "overview (30 s windows, per node)": chosen("allocation"),
    "idle GPU-hours (1 h windows)": chosen("idle"),
    "five (allocation, workloads, alerts, changelog, state)": chosen(
        "allocation", "workloads", "alerts", "changelog", "state"
    ),
    "all, as `gpulens worker` runs by default": lambda: operators_for(PipelineSettings()),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fleet-nodes", type=int, default=1250, help="Simulated nodes (8 GPUs each).")
    parser.add_argument("--fleet-seconds", type=float, default=120.0, help="Simulated seconds.")
    parser.add_argument("--skip-traces", action="store_true", help="Only the fleet sample path.")
    parser.add_argument(
        "--cases",
        default="",
        help="Comma-separated name prefixes of the cases to run (e.g. 'five,idle'); all by default.",
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="Runs per case; the least CPU is printed, every run beside it."
    )
    args = parser.parse_args()
    prefixes = tuple(p for p in args.cases.split(",") if p)
    tune_for_throughput()  # as `gpulens worker` does
    sections: list[tuple[str, list[Measured]]] = []
    for title, publish, cases in (
        ("traces (Alibaba v2023 + GenAI)", publish_traces, TRACE_CASES),
        (
            f"fleet sample path ({args.fleet_nodes:,} nodes x 8 GPUs every 2 s, {args.fleet_seconds:g} s)",
            lambda s, c: publish_fleet(s, c, args.fleet_nodes, args.fleet_seconds),
            FLEET_CASES,
        ),
    ):
        if args.skip_traces and publish is publish_traces:
            continue
        with tempfile.TemporaryDirectory() as tmp, private_platform(Path(tmp)) as settings:
            create_topics(settings.kafka)
            codec = AvroCodec(registry_client(settings.registry.url))
            print(f"... publishing the {title}", flush=True)
            publish(settings, codec)
            picked = {name: make for name, make in cases.items() if name.startswith(prefixes or "")}
            sections.append((title, measure(settings, codec, picked, args.repeat)))
    for title, rows in sections:
        print(f"\n{title}")
        print(f"{'processor':<40} {'records':>9} {'records/s':>10} {'per CPU-s':>11} {'samples/CPU-s':>12}")
        for row in rows:
            print(row.line())
    print(f"\npeak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MB")
    print(f"(samples/CPU-s: GPU samples in {GPU_SAMPLES.name} per CPU-second of this process)")


if __name__ == "__main__":
    main()
