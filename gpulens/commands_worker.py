"""`gpulens worker`: the stream processors (windowed GPU allocation, per cluster and node)."""

from __future__ import annotations

import signal
import threading
from types import FrameType

import click

from gpulens.cli_context import Context, pass_context


@click.command()
@click.option(
    "--window",
    "window_s",
    type=click.IntRange(min=1),
    default=30,
    show_default=True,
    help="Tumbling window size, seconds (epoch-aligned, half-open).",
)
@click.option(
    "--nodes/--no-nodes",
    "per_node",
    default=True,
    show_default=True,
    help="Also write node_gpu_allocation rows.",
)
@click.option(
    "--group",
    "group_id",
    default="gpulens-allocation",
    show_default=True,
    help="Consumer group and transactional id prefix; one worker per group.",
)
@click.option(
    "--idle-ms",
    type=click.IntRange(min=0),
    default=3000,
    show_default=True,
    help="How long a quiet input partition may hold the others back (event-time merge).",
)
@pass_context
def worker(context: Context, window_s: int, per_node: bool, group_id: str, idle_ms: int) -> None:
    """Aggregate pod and node events into cluster_gpu_allocation and node_gpu_allocation.

    Reads gpulens.pods.v1, gpulens.nodes.v1 and gpulens.watermarks.v1 in event-time order and
    writes gpulens.agg.cluster-gpu-allocation.v1 and gpulens.agg.node-gpu-allocation.v1, one
    Kafka transaction per cycle (exactly once, also across kill -9). Stops on SIGTERM/Ctrl-C.
    """
    from pipeline.running import AllocationWorker, WorkerOptions
    from schemas.codec import AvroCodec, registry_client
    from schemas.topic_admin import create_topics

    settings = context.settings
    create_topics(settings.kafka)
    stop = threading.Event()

    def _stop(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    options = WorkerOptions(group_id=group_id, window_ms=window_s * 1000, per_node=per_node, idle_ms=idle_ms)
    click.echo(
        f"worker {group_id}: {window_s} s windows, reading {settings.kafka.bootstrap_servers}", err=True
    )
    AllocationWorker(settings.kafka, AvroCodec(registry_client(settings.registry.url)), options).run(stop)
