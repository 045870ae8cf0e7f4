"""`gpulens exporter`: Prometheus /metrics from the derived topics, under Primus-Lens's names."""

from __future__ import annotations

import signal
import threading
from types import FrameType

import click

from gpulens.cli_context import Context, pass_context
from gpulens.tuning import tune_for_throughput


@click.command()
@click.option("--host", help="Address /metrics binds [exporter.host].")
@click.option("--port", type=click.IntRange(0, 65535), help="Port of /metrics, 0 for any [exporter.port].")
@click.option("--group", "group_id", help="Consumer group [exporter.group_id].")
@pass_context
def exporter(context: Context, host: str | None, port: int | None, group_id: str | None) -> None:
    """Serve Prometheus /metrics from the allocation, workload and alert topics.

    Keeps the newest window per series and checkpoints it to its state log
    (gpulens.exporter.<group>.changelog). A start serves at once, restores the series from
    there and reads on from the checkpointed offsets, so a restart never replays history;
    serves until SIGTERM/Ctrl-C. Metric names are Primus-Lens's (gpu_allocation_rate,
    consumer_pod_gpu_usage, ...), each with a cluster label, plus the exporter's own health
    (gpulens_exporter_*, lag, dead letters). It never reads the GPU sample stream: each node
    agent serves its GPUs' gauges (gpu_utilization, ...); exporter.per_gpu = true also serves
    them here, from each node's newest batch on gpulens.state.gpu-samples.v1 (its tail only).
    """
    from gpulens.consumers.prometheus.exporting import run_exporter
    from gpulens.schemas.kafka.topic_admin import create_topics
    from gpulens.schemas.wire.codec import AvroCodec, registry_client

    settings = context.settings
    overrides = {"host": host, "port": port, "group_id": group_id}
    options = settings.exporter.model_copy(update={k: v for k, v in overrides.items() if v is not None})
    create_topics(settings.kafka)
    stop = threading.Event()

    def _stop(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    click.echo(f"exporter {options.group_id}: reading {settings.kafka.bootstrap_servers}", err=True)
    codec = AvroCodec(registry_client(settings.registry.url))
    tune_for_throughput()
    run_exporter(settings.kafka, codec, options, stop)
