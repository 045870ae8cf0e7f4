"""`gpulens exporter`: Prometheus /metrics from the derived topics, under Primus-Lens's names."""

from __future__ import annotations

import click

from gpulens.cli_context import Context, pass_context, with_flags
from gpulens.commands.service import run_service
from gpulens.schemas.model.topics import CATALOG


@click.command()
@click.option("--host", help="Address /metrics binds [exporter.host].")
@click.option("--port", type=click.IntRange(0, 65535), help="Port of /metrics, 0 for any [exporter.port].")
@click.option("--group", "group_id", help="Consumer group [exporter.group_id].")
@pass_context
def exporter(context: Context, /, **_exporter_flags: object) -> None:
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

    settings = context.settings
    options = with_flags(settings.exporter)
    run_service(
        settings,
        lambda service: run_exporter(settings.kafka, service.codec, options, service.stop),
        topics=CATALOG,
        banner=f"exporter {options.group_id}: reading {settings.kafka.bootstrap_servers}",
        tuned=True,
    )
