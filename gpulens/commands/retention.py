"""`gpulens retention`: keep the embedded broker's memory bounded by deleting consumed records."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from gpulens.cli_context import Context, pass_context
from gpulens.commands.service import Metrics, run_service
from gpulens.config import GPULensSettings

if TYPE_CHECKING:
    from gpulens.infra.retaining import RetentionPolicy


def retention_policy(settings: GPULensSettings) -> RetentionPolicy:
    """The catalog's topics, each held back by every group and by the pipeline's own groups
    until they have committed on every partition they read."""
    from gpulens.draining import pipeline_groups
    from gpulens.infra.retaining import RetentionPolicy
    from gpulens.schemas.model.topics import CATALOG

    return RetentionPolicy(
        topics=CATALOG,
        keep_ms=round(settings.retention.keep_s * 1000),
        required=pipeline_groups(settings),
        ignored=settings.retention.ignored_groups,
        max_records=settings.retention.max_records_per_partition,
        spare_ms=round(settings.retention.cap_spares_s * 1000),
    )


@click.command()
@click.option("--once", is_flag=True, help="Run one pass, print what it deleted, and exit.")
@pass_context
def retention(context: Context, once: bool) -> None:
    """Delete from the broker the records every consumer group has consumed, once older than
    retention.keep_s (or the topic's retention.ms), every retention.interval_s; and, past
    retention.max_records_per_partition, the oldest records of a partition even where a group
    has not consumed them (a warning names the groups).

    Compacted topics (gpulens.state.*) and topics outside the catalog (checkpoint changelogs)
    are never touched. `gpulens up` runs it on the embedded noida-db broker, which holds every
    record it keeps in memory. Serves /metrics (gpulens_retention_*) on retention.metrics_port.
    """
    from gpulens.infra.retaining import Retainer, RetentionMetrics, run_retention

    settings = context.settings
    options = settings.retention
    metrics = RetentionMetrics()
    retainer = Retainer(settings.kafka, retention_policy(settings), metrics=metrics)
    if once:
        for cut in retainer.run_once():
            lost = f" ({cut.dropped:,} not consumed by {', '.join(cut.behind)})" if cut.dropped else ""
            click.echo(
                f"{cut.topic}/{cut.partition}: deleted {cut.records:,} records below {cut.offset:,}{lost}"
            )
        return
    run_service(
        settings,
        lambda service: run_retention(retainer, metrics, interval_s=options.interval_s, stop=service.stop),
        metrics=Metrics(options.metrics_port, options.metrics_host, metrics.registry),
        banner=f"retention: every {options.interval_s:g} s, keeping consumed records {options.keep_s:g} s "
        f"and at most {options.max_records_per_partition:,} records a partition, "
        f"on {settings.kafka.bootstrap_servers}",
    )
