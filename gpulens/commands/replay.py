"""`gpulens replay`: publish real public cluster traces as the live producers would."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path

import click

from gpulens.cli_context import Context, pass_context
from gpulens.commands.service import Service, run_service
from gpulens.producers.replay.locating import traces_dir
from gpulens.schemas.model.models import Event
from gpulens.schemas.model.topics import CATALOG, TopicSpec

ALIBABA = traces_dir() / "alibaba-gpu-v2023"
GENAI = traces_dir() / "alibaba-genai-2026"


def _speed(value: str) -> float | None:
    if value == "max":
        return None
    try:
        speed = float(value)
    except ValueError:
        raise click.BadParameter("use 'max' or a factor such as 60 (one trace minute per second)") from None
    if speed <= 0:
        raise click.BadParameter("the factor must be above 0")
    return speed


_PART = click.option(
    "--part",
    "parts",
    type=click.Choice(["nodes", "pods", "samples"]),
    multiple=True,
    help="Publish only this part (repeatable), as a source of its own: nodes (and inventories), "
    "pods (and containers), samples. Run one process per part to publish as a cluster's watchers "
    "and agents do, independently.",
)

_CLUSTER = click.option(
    "--cluster",
    default=None,
    help="Cluster name in every record [default: the configured one]. Replays of different "
    "traces into one cluster merge; give each its own name to keep them apart.",
)


def _publish(
    context: Context,
    plan: Callable[[], Iterable[tuple[TopicSpec, Event]]],
    parts: tuple[str, ...],
    speed: str,
    label: str,
) -> None:
    """Publish what ``plan`` reads from a trace, once the topics exist: an unreachable broker is
    an error at once, before a trace is read."""
    from gpulens.producers.publishing import EventPublisher
    from gpulens.producers.replay.pacing import replay

    def work(service: Service) -> int:
        events = list(plan())
        if parts:
            from gpulens.producers.replay.splitting import only

            events = list(only(events, parts))
        publisher = EventPublisher(service.settings.kafka, service.codec)
        with click.progressbar(length=len(events), label=label, file=click.get_text_stream("stderr")) as bar:
            return replay(events, publisher, speed=_speed(speed), progress=bar.update)

    count = run_service(context.settings, work, topics=CATALOG, signals=())
    click.echo(f"published {count:,} events")


@click.group()
def replay() -> None:
    """Publish a real public GPU-cluster trace as GPULens events.

    Traces are read from the repository's traces/ folder, or GPULENS_TRACES_DIR.
    """


@replay.command("alibaba-v2023")
@click.option(
    "--nodes",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    default=ALIBABA / "openb_node_list_gpu_node.csv",
    show_default=True,
    help="Node list CSV.",
)
@click.option(
    "--pods",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    default=ALIBABA / "openb_pod_list_default.csv",
    show_default=True,
    help="Pod list CSV.",
)
@click.option(
    "--epoch",
    type=click.DateTime(["%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%d"]),
    default="2023-01-01",
    show_default=True,
    help="Calendar time of the trace's second 0 (UTC).",
)
@click.option("--speed", default="max", show_default=True, help="'max', or N times real time.")
@click.option(
    "--devices/--no-devices",
    default=False,
    show_default=True,
    help="Also publish each node's GPUs and the GPUs each bound pod's container holds.",
)
@_PART
@_CLUSTER
@pass_context
def alibaba_v2023(
    context: Context,
    nodes: Path,
    pods: Path,
    epoch: datetime,
    speed: str,
    devices: bool,
    parts: tuple[str, ...],
    cluster: str | None,
) -> None:
    """Alibaba cluster-trace-gpu-v2023: nodes first, then every GPU pod created, bound, deleted.

    Pods are bound by a deterministic best fit on GPU model and free GPUs (the trace has no
    binding); cluster-level figures do not depend on it. Pods without GPUs are skipped.
    """
    from gpulens.producers.replay import alibaba_v2023 as trace

    _publish(
        context,
        lambda: trace.plan(
            trace.read_nodes(nodes),
            trace.read_pods(pods),
            cluster=cluster or context.settings.cluster,
            epoch=epoch.replace(tzinfo=UTC),
            devices=devices,
        ),
        parts,
        speed,
        f"alibaba-v2023 → {context.settings.kafka.bootstrap_servers}",
    )


@replay.command("genai-duty")
@click.option(
    "--samples",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    default=GENAI / "pod_gpu_duty_cycle_48pods.csv",
    show_default=True,
    help="Duty-cycle CSV.",
)
@click.option("--speed", default="max", show_default=True, help="'max', or N times real time.")
@_PART
@_CLUSTER
@pass_context
def genai_duty(
    context: Context, samples: Path, speed: str, parts: tuple[str, ...], cluster: str | None
) -> None:
    """Alibaba GenAI 2026 duty cycles: each pod a one-GPU pod on its own node, each row a sample."""
    from gpulens.producers.replay import genai_duty as trace

    _publish(
        context,
        lambda: trace.plan(trace.read_samples(samples), cluster=cluster or context.settings.cluster),
        parts,
        speed,
        f"genai-duty → {context.settings.kafka.bootstrap_servers}",
    )
