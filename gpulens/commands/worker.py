"""`gpulens worker`: the stream processors (windows, alerts, device changelog, state tables)."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from gpulens.cli_context import Context, ShardType, pass_context, with_flags
from gpulens.commands.service import Metrics, run_service
from gpulens.pipeline.settings import PROCESSORS, PipelineSettings, split_commas
from gpulens.schemas.model.topics import CATALOG


def _option(*flags: str, setting: str, **kwargs: Any) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """The flag of the [pipeline] setting ``setting``: its default and help are the setting's."""
    field = PipelineSettings.model_fields[setting]
    kwargs.setdefault("default", field.default)
    return click.option(
        *flags, setting, show_default=field.default is not None, help=field.description, **kwargs
    )


def _processors(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[str, ...]:
    chosen = split_commas(value)
    if set(chosen) - set(PROCESSORS) or not chosen:
        raise click.BadParameter(
            f"choose from {', '.join(PROCESSORS)} (got {value!r})", param_hint="--processors"
        )
    return chosen


def _lower_priority(by: int) -> None:
    """Lower the priority of this process's threads by ``by``: on Linux nice is per thread, and
    threads started later inherit their starter's, so the running ones (numpy's OpenBLAS pool,
    started at import) are lowered one by one."""
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        os.nice(by)
        return
    for task in tasks.iterdir():
        thread = int(task.name)
        try:
            os.setpriority(os.PRIO_PROCESS, thread, min(os.getpriority(os.PRIO_PROCESS, thread) + by, 19))
        except ProcessLookupError:  # ended meanwhile
            continue


@click.command()
@_option("--window", setting="window_s", type=click.IntRange(min=1))
@_option("--nodes/--no-nodes", setting="per_node")
@_option("--overview/--no-overview", setting="overview")
@_option(
    "--processors",
    setting="processors",
    default=",".join(PipelineSettings.model_fields["processors"].default),
    callback=_processors,
)
@_option("--latest-every", setting="latest_every_s", type=click.FloatRange(min=0))
@_option("--idle-below", setting="idle_below", type=click.FloatRange(min=0))
@_option("--idle-for", setting="idle_for", type=click.FloatRange(min=0))
@_option("--idle-window", setting="idle_window_s", type=click.IntRange(min=1))
@_option("--owner-labels", setting="owner_labels", default="", callback=lambda _c, _p, v: split_commas(v))
@_option("--compute-idle-below", setting="compute_idle_below", type=click.FloatRange(min=0))
@_option("--memory-floor", setting="memory_floor_mib", type=click.IntRange(min=0))
@_option("--sample-valid", setting="sample_valid_s", type=click.FloatRange(min=0, min_open=True))
@_option("--pending-for", setting="pending_for", type=click.FloatRange(min=0))
@_option("--stale-after", setting="stale_after", type=click.FloatRange(min=0, min_open=True))
@_option("--pile-up-pods", setting="pile_up_pods", type=click.IntRange(min=1))
@_option("--pile-up-idle-gpus", setting="pile_up_idle_gpus", type=click.IntRange(min=1))
@_option("--group", setting="group_id")
@_option("--idle-ms", setting="idle_ms", type=click.IntRange(min=0))
@_option("--source-timeout", setting="source_timeout_s", type=click.FloatRange(min=0))
@_option("--allowed-lateness", setting="allowed_lateness_s", type=click.FloatRange(min=0))
@_option("--hold", setting="hold_records", type=click.IntRange(min=1))
@_option("--hold-decoded", setting="hold_decoded", type=click.IntRange(min=0))
@_option("--hold-columns", setting="hold_columns", type=click.IntRange(min=0))
@_option("--cycle", setting="cycle_s", type=click.FloatRange(min=0, max=30.0, min_open=True))
@_option("--commit-share", setting="commit_share", type=click.FloatRange(min=0, max=1.0, min_open=True))
@_option("--cycle-max", setting="cycle_max_s", type=click.FloatRange(min=0, max=30.0, min_open=True))
@_option("--nice", setting="nice", type=click.IntRange(0, 19))
@_option("--max-ahead", setting="max_ahead_s", type=click.FloatRange(min=1.0))
@_option("--max-behind", setting="max_behind_s", type=click.FloatRange(min=0.0))
@_option("--hanging-transaction", setting="hanging_transaction_s", type=click.FloatRange(min=10.0))
@_option("--compaction-min-rows", setting="compaction_min_rows", type=click.IntRange(min=0))
@_option("--shard", setting="shard", type=ShardType())
@_option("--metrics-port", setting="metrics_port", type=click.IntRange(1, 65535))
@_option("--metrics-host", setting="metrics_host")
@pass_context
def worker(context: Context, /, **_flags: object) -> None:
    """Turn event topics into windows, alerts, the device changelog and state tables.

    Reads the node, workload, pod, inventory, container, GPU health, sample and watermark topics in
    event-time order per cluster; writes gpulens.agg.*.v1 (allocation, workload usage, idle
    GPU-hours by owner, why GPU pods wait),
    gpulens.alerts.v1, gpulens.changelog.devices.v1 and the compacted gpulens.state.*.v1
    (newest state of every pod, node, inventory, container and workload; with the `latest`
    processor each node's newest GPU sample batch, for the exporter's per-GPU mode), one Kafka
    transaction per cycle (exactly once, also across kill -9; a cycle lasts --cycle, stretched
    under load so that commits take about --commit-share of its time, up to --cycle-max).
    On the embedded broker, which never compacts, the worker compacts the state topics itself
    (--compaction-min-rows). Each processor's state goes to
    gpulens.worker.<group>.<processor>.changelog (what changes at nearly every cycle to
    ….<processor>.hot.changelog) in the same transaction: a restart
    restores it and reads on from where the last cycle ended, never from the beginning.

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

    Every option is also a setting of [pipeline] in the config file or a GPULENS_PIPELINE__*
    variable (README, Configuration; e.g. window_s for --window); a flag given here wins.
    """
    from gpulens.pipeline.event_time import EventTimeBounds
    from gpulens.pipeline.operators import operators_for
    from gpulens.pipeline.running import WorkerOptions, run_worker

    settings = context.settings
    pipeline = with_flags(settings.pipeline)
    chosen = pipeline.processors
    if pipeline.nice:
        _lower_priority(pipeline.nice)

    options = WorkerOptions(
        group_id=pipeline.consumer_group,
        idle_ms=pipeline.idle_ms,
        source_timeout_s=pipeline.source_timeout_s,
        allowed_lateness_ms=round(pipeline.allowed_lateness_s * 1000),
        hold_records=pipeline.hold_records,
        hold_decoded=pipeline.hold_decoded,
        hold_columns=pipeline.hold_columns,
        cycle_s=pipeline.cycle_s,
        commit_share=pipeline.commit_share,
        cycle_max_s=pipeline.cycle_max_s,
        shard=pipeline.shard,
        # Only the embedded noida-db forgets open transactions (gpulens.pipeline.hanging_transactions);
        # elsewhere the broker's coordinator aborts them, and raw requests are not ours to send.
        hanging_transaction_s=pipeline.hanging_transaction_s if settings.platform.broker == "noida" else None,
        # Elsewhere the broker compacts; shards would cut each other's rows (gpulens.pipeline.compaction).
        compaction_min_rows=pipeline.compaction_min_rows
        if settings.platform.broker == "noida" and pipeline.shard.count == 1
        else 0,
        bounds=EventTimeBounds(
            max_ahead_ms=round(pipeline.max_ahead_s * 1000), max_behind_ms=round(pipeline.max_behind_s * 1000)
        ),
    )
    run_service(
        settings,
        lambda service: run_worker(
            settings.kafka, service.codec, lambda: operators_for(pipeline), options, service.stop
        ),
        topics=CATALOG,
        metrics=Metrics(pipeline.metrics_port, pipeline.metrics_host),
        banner=f"worker {options.group_id}: {', '.join(chosen)}; shard {pipeline.shard}; "
        f"reading {settings.kafka.bootstrap_servers}",
        tuned=True,
    )
    # Its cycle is committed or aborted and its consumer closed: what is left in memory needs no
    # cleanup, and freeing it object by object (a catch-up's buffered records) took 3-12 s.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
