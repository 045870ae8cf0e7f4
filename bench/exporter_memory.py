"""The exporter's state and one scrape of it at fleet scale, an hour in.

    python -m bench.exporter_memory [--nodes 12500] [--workloads 25000]

An hour into a cluster of ``--nodes`` nodes (8 GPUs each) running ``--workloads`` workloads, the
exporter holds a node row per node, a workload row per workload and an idle_gpu_hours row per
GPU and owner (here one owner per GPU, a workload every 8 GPUs). The rows are encoded as the
worker writes them (Confluent framing, a private platform's registry) and decoded by the
exporter's codec; the bench prints, per kind, the memory (``tracemalloc``) that
:class:`~gpulens.consumers.prometheus.state.LatestState` takes for them beside the baseline,
the decoded rows kept with their bytes, and then the text and peak memory of one scrape through
prometheus-client. Prints the figures; never asserts.
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import tracemalloc
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from gpulens.consumers.prometheus.collecting import StateCollector
from gpulens.consumers.prometheus.state import LatestState
from gpulens.platform import private_platform
from gpulens.schemas.model.models import IdleGpuHours, NodeGpuAllocation, Record, WorkloadGpuUsage
from gpulens.schemas.model.topics import IDLE_GPU_HOURS, NODE_ALLOCATION, WORKLOAD_USAGE, TopicSpec
from gpulens.schemas.wire.codec import AvroCodec, registry_client
from gpulens.testing.memory import traced_bytes

CLUSTER = "fleet"
START = datetime(2026, 1, 1, tzinfo=UTC)
END = START + timedelta(hours=1)


def uid(workload: int) -> str:
    return f"{workload:08x}-6c1e-4f7a-9d2b-0242ac120002"


def node_row(node: int) -> NodeGpuAllocation:
    return NodeGpuAllocation(
        event_id=f"{CLUSTER}/node-{node:05d}/{START:%FT%T}",
        cluster=CLUSTER,
        node=f"node-{node:05d}",
        gpu_model="MI300X",
        window_start=START,
        window_end=END,
        gpu_capacity=8,
        gpus_allocated_avg=7.5,
        gpus_allocated_max=8,
        gpus_allocated_end=8,
        allocation_rate_avg=0.94,
        pods_running_end=2,
    )


def workload_row(workload: int) -> WorkloadGpuUsage:
    return WorkloadGpuUsage(
        event_id=f"{CLUSTER}/{uid(workload)}/{START:%FT%T}",
        cluster=CLUSTER,
        workload_uid=uid(workload),
        workload_kind="PyTorchJob",
        workload_name=f"pretrain-{workload}",
        namespace=f"team-{workload % 20}",
        window_start=START,
        window_end=END,
        gpus_allocated_avg=8.0,
        gpus_allocated_max=8.0,
        gpus_allocated_end=8.0,
        utilization_avg=61.5,
        utilization_max=99.0,
        samples=14_400,
        pods_active_end=1,
    )


def idle_row(gpu: int, workloads: int) -> IdleGpuHours:
    node, workload = f"node-{gpu // 8:05d}", gpu // 8 % workloads
    return IdleGpuHours(
        event_id=f"{CLUSTER}/{node}/{gpu % 8}/{uid(workload)}/{START:%FT%T}",
        cluster=CLUSTER,
        window_start=START,
        window_end=END,
        node=node,
        device_id=f"0000:{0x11 + gpu % 8:02x}:00.0",
        workload_uid=uid(workload),
        workload_kind="PyTorchJob",
        workload_name=f"pretrain-{workload}",
        namespace=f"team-{workload % 20}",
        owner_labels={"team": f"team-{workload % 20}"},
        active_gpu_hours=0.55,
        idle_gpu_hours=0.3,
        memory_idle_gpu_hours=0.1,
        unmeasured_gpu_hours=0.05,
        unallocated_gpu_hours=0.0,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=12_500, help="Nodes of 8 GPUs (12,500: 100,000 GPUs).")
    parser.add_argument("--workloads", type=int, default=25_000, help="Workloads holding GPUs.")
    args = parser.parse_args()
    kinds: list[tuple[str, TopicSpec, list[Record]]] = [
        ("node", NODE_ALLOCATION, [node_row(n) for n in range(args.nodes)]),
        ("workload", WORKLOAD_USAGE, [workload_row(w) for w in range(args.workloads)]),
        ("idle", IDLE_GPU_HOURS, [idle_row(g, args.workloads) for g in range(8 * args.nodes)]),
    ]
    with (
        tempfile.TemporaryDirectory(prefix="exporter-memory-") as directory,
        private_platform(Path(directory)) as settings,
    ):
        codec = AvroCodec(registry_client(settings.registry.url))
        measure(codec, [(kind, topic, [codec.encode(topic, r) for r in rows]) for kind, topic, rows in kinds])


def decoded(codec: AvroCodec, topic: TopicSpec, values: list[bytes]) -> list[tuple[Record, bytes]]:
    """The baseline: each row decoded, kept with its bytes."""
    return [(codec.decode(topic, value), value) for value in values]


def applied(state: LatestState, codec: AvroCodec, topic: TopicSpec, values: list[bytes]) -> LatestState:
    for value in values:
        state.apply(codec.decode(topic, value), value)
    return state


def measure(codec: AvroCodec, kinds: list[tuple[str, TopicSpec, list[bytes]]]) -> None:
    tracemalloc.start()
    state = LatestState()
    print(f"{'kind':<9} {'rows':>8} {'bytes each':>10} {'decoded rows + bytes':>21} {'LatestState':>12}")
    for kind, topic, values in kinds:
        baseline = traced_bytes(partial(decoded, codec, topic, values))[0] / 1e6
        held = traced_bytes(partial(applied, state, codec, topic, values))[0] / 1e6
        print(f"{kind:<9} {len(values):>8,} {len(values[0]):>10} {baseline:>18.1f} MB {held:>9.1f} MB")
    registry = CollectorRegistry()
    registry.register(StateCollector(state))
    gc.collect()
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    text = generate_latest(registry)
    peak = (tracemalloc.get_traced_memory()[1] - before) / 1e6
    lines = text.count(b"\n")
    print(f"one scrape: {len(text) / 1e6:.1f} MB of text, {lines:,} lines; its peak {peak:.1f} MB")


if __name__ == "__main__":
    main()
