"""The main job: platform, topics, tables, the pipeline's processes, real data, a report.

`gpulens up` brings everything up in order and is idempotent; `gpulens down` stops exactly
what it started (pipeline first, then the platform). Without a Kubernetes cluster to watch,
the public traces are replayed so that there is real data to look at.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import click

from gpulens.config import GPULensSettings
from infra.launching import ServiceManager, ServiceSpec

WORKER, SINK = "worker", "sink"
PIPELINE = (WORKER, SINK)
"""Started after the platform, stopped before it."""

DEMO_WINDOW_S = 3600
"""The traces span months: hourly windows keep the demo's tables readable."""


def pipeline_specs(config_file: Path | None) -> dict[str, ServiceSpec]:
    """The pipeline's long-running processes, as `gpulens up` starts them."""
    python = [sys.executable, "-m", "gpulens"]
    if config_file is not None:
        python += ["--config", str(config_file.resolve())]
    return {
        WORKER: ServiceSpec(WORKER, [*python, "worker", "--window", str(DEMO_WINDOW_S), "--no-nodes"]),
        SINK: ServiceSpec(SINK, [*python, "sink"]),
    }


def start_pipeline(services: ServiceManager, config_file: Path | None, echo: Callable[[str], None]) -> None:
    """Start the worker and the sink unless they run already."""
    for name, spec in pipeline_specs(config_file).items():
        status, started = services.start(spec)
        echo(f"  {name:<11} {'started' if started else 'already running':<16} pid {status.pid}")


def stop_pipeline(services: ServiceManager, echo: Callable[[str], None]) -> None:
    """Stop the pipeline's processes (they flush what they hold on SIGTERM)."""
    for name in reversed(PIPELINE):
        echo(f"  {name:<11} {'stopped' if services.stop(name, timeout=60) else 'was not running'}")


def replay_traces(settings: GPULensSettings) -> int:
    """Publish both public traces (Alibaba v2023 pods, GenAI duty cycles) with progress bars."""
    from producers.publishing import EventPublisher
    from producers.replay import alibaba_v2023, genai_duty
    from producers.replay.locating import traces_dir
    from producers.replay.pacing import replay
    from schemas.codec import AvroCodec, registry_client

    traces = traces_dir()
    codec = AvroCodec(registry_client(settings.registry.url))
    plans = {
        "alibaba-v2023": lambda: alibaba_v2023.plan(
            alibaba_v2023.read_nodes(traces / "alibaba-gpu-v2023/openb_node_list_gpu_node.csv"),
            alibaba_v2023.read_pods(traces / "alibaba-gpu-v2023/openb_pod_list_default.csv"),
            cluster=f"{settings.cluster}-alibaba",
            epoch=datetime(2023, 1, 1, tzinfo=UTC),
        ),
        "genai-duty": lambda: genai_duty.plan(
            genai_duty.read_samples(traces / "alibaba-genai-2026/pod_gpu_duty_cycle_48pods.csv"),
            cluster=f"{settings.cluster}-genai",
        ),
    }
    total = 0
    for name, make in plans.items():
        events = list(make())
        with click.progressbar(length=len(events), label=f"  replay {name:<14}", file=sys.stderr) as bar:
            total += replay(events, EventPublisher(settings.kafka, codec), progress=bar.update)
    return total


def wait_for(condition: Callable[[], bool], *, timeout: float, what: str) -> None:
    """Poll ``condition`` until true; a clear error after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise click.ClickException(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(1.0)
