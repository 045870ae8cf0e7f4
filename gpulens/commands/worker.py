"""`gpulens worker`: the stream processors (windows, alerts, device changelog, state tables)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from types import FrameType

import click

from gpulens.cli_context import Context, ShardType, pass_context
from gpulens.schemas.kafka.sharding import Shard
from gpulens.tuning import tune_for_throughput

PROCESSORS = ("allocation", "workloads", "alerts", "changelog", "state", "latest")
DEFAULT_PROCESSORS = PROCESSORS[:-1]
"""``latest`` (each node's newest samples, for the exporter's per-GPU mode) runs only when asked."""


@click.command()
@click.option(
    "--window",
    "window_s",
    type=click.IntRange(min=1),
    default=30,
    show_default=True,
    help="Allocation window size, seconds (tumbling, epoch-aligned, half-open).",
)
@click.option(
    "--nodes/--no-nodes",
    "per_node",
    default=True,
    show_default=True,
    help="Also write node_gpu_allocation rows.",
)
@click.option(
    "--overview/--no-overview",
    default=True,
    show_default=True,
    help="Also write cluster_overview rows (reads GPU samples for utilization).",
)
@click.option(
    "--processors",
    default=",".join(DEFAULT_PROCESSORS),
    show_default=True,
    help=f"Which processors to run, comma-separated, of {', '.join(PROCESSORS)}.",
)
@click.option(
    "--latest-every",
    "latest_every_s",
    type=click.FloatRange(min=0),
    default=15.0,
    show_default=True,
    help="latest: republish a node's sample batch on gpulens.state.gpu-samples.v1 at most once "
    "per this many event-time seconds.",
)
@click.option(
    "--idle-below",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    help="GpuIdle: utilization threshold, percent.",
)
@click.option(
    "--idle-for",
    type=click.FloatRange(min=0),
    default=600.0,
    show_default=True,
    help="GpuIdle: how long under the threshold, seconds.",
)
@click.option(
    "--pending-for",
    type=click.FloatRange(min=0),
    default=300.0,
    show_default=True,
    help="GpuPodPending: how long unbound, seconds.",
)
@click.option(
    "--group",
    "group_id",
    default="gpulens-worker",
    show_default=True,
    help="Consumer group and transactional id; one worker per group and outputs.",
)
@click.option(
    "--idle-ms",
    type=click.IntRange(min=0),
    default=3000,
    show_default=True,
    help="Clusters whose sources publish no watermarks: how long a quiet input partition may "
    "hold the others back (event-time merge).",
)
@click.option(
    "--source-timeout",
    "source_timeout_s",
    type=click.FloatRange(min=0),
    default=10.0,
    show_default=True,
    help="A source silent this long (wall seconds) stops holding its cluster's event time back; "
    "a new cluster's time also waits this long for its sources to speak.",
)
@click.option(
    "--allowed-lateness",
    "allowed_lateness_s",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Process records this many event-time seconds behind their cluster's watermark.",
)
@click.option(
    "--hold",
    "hold_records",
    type=click.IntRange(min=1),
    default=50_000,
    show_default=True,
    help="Records held for event-time order past which input partitions running ahead in event "
    "time are paused, so that a worker catching up on a backlog reads the others (watermarks "
    "among them) first: bounds its memory.",
)
@click.option(
    "--max-ahead",
    "max_ahead_s",
    type=click.FloatRange(min=1.0),
    default=86_400.0,
    show_default=True,
    help="Dead-letter (event-time-out-of-bounds) a record or watermark more than this many "
    "seconds ahead of both the wall clock and its cluster's newest event time: it would close "
    "every window up to it.",
)
@click.option(
    "--max-behind",
    "max_behind_s",
    type=click.FloatRange(min=0.0),
    default=7 * 86_400.0,
    show_default=True,
    help="Dead-letter (event-time-out-of-bounds) a record more than this many seconds behind "
    "what its cluster already processed, instead of applying it late; 0: no horizon. Records "
    "before 2000-01-01 always are.",
)
@click.option(
    "--shard",
    type=ShardType(),
    default="0/1",
    show_default=True,
    help="Run N workers as 0/N .. N-1/N: shard I keeps the clusters whose name hashes to I "
    "(its consumer group and transactional ids get the suffix -IofN).",
)
@click.option("--metrics-port", type=click.IntRange(1, 65535), help="Serve Prometheus /metrics on this port.")
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    help="Address /metrics binds (0.0.0.0 in a pod).",
)
@pass_context
def worker(
    context: Context,
    window_s: int,
    per_node: bool,
    overview: bool,
    processors: str,
    latest_every_s: float,
    idle_below: float,
    idle_for: float,
    pending_for: float,
    group_id: str,
    idle_ms: int,
    hold_records: int,
    source_timeout_s: float,
    allowed_lateness_s: float,
    max_ahead_s: float,
    max_behind_s: float,
    shard: Shard,
    metrics_port: int | None,
    metrics_host: str,
) -> None:
    """Turn event topics into windows, alerts, the device changelog and state tables.

    Reads the node, workload, pod, inventory, container, sample and watermark topics in
    event-time order per cluster; writes gpulens.agg.*.v1 (allocation, workload usage),
    gpulens.alerts.v1, gpulens.changelog.devices.v1 and the compacted gpulens.state.*.v1
    (newest state of every pod, node, inventory, container and workload; with the `latest`
    processor each node's newest GPU sample batch, for the exporter's per-GPU mode), one Kafka
    transaction per cycle (exactly once, also across kill -9). Each processor's state goes to
    gpulens.worker.<group>.<processor>.changelog in the same transaction: a restart restores
    it and reads on from where the last cycle ended, never from the beginning.

    Event time advances per cluster by the watermarks its sources publish: the smallest over
    its live sources (a source silent for --source-timeout stops counting), records released
    --allowed-lateness behind it. A state change older than that is applied at the cluster's
    current time and reported, never dropped, unless its time is out of bounds (--max-ahead,
    --max-behind, before 2000): those go to gpulens.dlq.v1 as event-time-out-of-bounds and move
    no clock. Windows a long gap closes are written as they close, in bounded memory, the cycle
    committed between two windows. When every source of a cluster has sent its
    final watermark, every open window closes. Clusters without watermarks fall back to the
    --idle-ms partition rule. Stops within seconds on SIGTERM/Ctrl-C, whatever it is doing:
    the cycle in flight is aborted and a restart redoes it.
    """
    from gpulens.pipeline.alerting import AlertRules
    from gpulens.pipeline.event_time import EventTimeBounds
    from gpulens.pipeline.operators import (
        AlertOperator,
        AllocationOperator,
        DeviceChangelogOperator,
        LatestSamplesOperator,
        Operator,
        StateOperator,
        WorkloadUsageOperator,
    )
    from gpulens.pipeline.running import WorkerOptions, run_worker
    from gpulens.pipeline.windows import TumblingWindows
    from gpulens.schemas.kafka.topic_admin import create_topics
    from gpulens.schemas.wire.codec import AvroCodec, registry_client

    chosen = [p.strip() for p in processors.split(",") if p.strip()]
    unknown = sorted(set(chosen) - set(PROCESSORS))
    if unknown or not chosen:
        raise click.BadParameter(
            f"choose from {', '.join(PROCESSORS)} (got {processors!r})", param_hint="--processors"
        )

    def operators() -> list[Operator]:
        made: list[Operator] = []
        if "allocation" in chosen:
            made.append(
                AllocationOperator(TumblingWindows(window_s * 1000), per_node=per_node, overview=overview)
            )
        if "workloads" in chosen:
            made.append(WorkloadUsageOperator(TumblingWindows(window_s * 1000)))
        if "alerts" in chosen:
            made.append(AlertOperator(AlertRules(idle_below, idle_for, pending_for)))
        if "changelog" in chosen:
            made.append(DeviceChangelogOperator())
        if "state" in chosen:
            made.append(StateOperator())
        if "latest" in chosen:
            made.append(LatestSamplesOperator(round(latest_every_s * 1000)))
        return made

    settings = context.settings
    create_topics(settings.kafka)
    if metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(metrics_port, addr=metrics_host)
    stop = threading.Event()

    def _stop(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    if shard.count > 1:
        group_id = f"{group_id}-{shard.index}of{shard.count}"
    click.echo(
        f"worker {group_id}: {', '.join(chosen)}; shard {shard}; reading {settings.kafka.bootstrap_servers}",
        err=True,
    )
    codec = AvroCodec(registry_client(settings.registry.url))
    tune_for_throughput()
    options = WorkerOptions(
        group_id=group_id,
        idle_ms=idle_ms,
        source_timeout_s=source_timeout_s,
        allowed_lateness_ms=round(allowed_lateness_s * 1000),
        hold_records=hold_records,
        shard=shard,
        # Only the embedded noida-db forgets open transactions (gpulens.pipeline.hanging_transactions);
        # elsewhere the broker's coordinator aborts them, and raw requests are not ours to send.
        hanging_transaction_s=75.0 if settings.platform.broker == "noida" else None,
        bounds=EventTimeBounds(
            max_ahead_ms=round(max_ahead_s * 1000), max_behind_ms=round(max_behind_s * 1000)
        ),
    )
    run_worker(settings.kafka, codec, operators, options, stop)
    # Its cycle is committed or aborted and its consumer closed: what is left in memory needs no
    # cleanup, and freeing it object by object (a catch-up's buffered records) took 3-12 s.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
