"""Replay rate of the trace replayers: plan (CSV -> events) and publish (Avro -> broker), events/s.

    python -m bench.replay_rate

Starts a private platform (free ports, temporary state); never asserts, only prints.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from gpulens.platform import private_platform
from gpulens.producers.publishing import EventPublisher
from gpulens.producers.replay import alibaba_v2023, genai_duty
from gpulens.producers.replay.locating import traces_dir
from gpulens.producers.replay.pacing import replay
from gpulens.schemas.kafka.topic_admin import create_topics
from gpulens.schemas.model.models import Event
from gpulens.schemas.model.topics import TopicSpec
from gpulens.schemas.wire.codec import AvroCodec, registry_client


def main() -> None:
    traces = traces_dir()
    plans: dict[str, Callable[[], list[tuple[TopicSpec, Event]]]] = {
        "alibaba-v2023 (default)": lambda: list(
            alibaba_v2023.plan(
                alibaba_v2023.read_nodes(traces / "alibaba-gpu-v2023/openb_node_list_gpu_node.csv"),
                alibaba_v2023.read_pods(traces / "alibaba-gpu-v2023/openb_pod_list_default.csv"),
                cluster="bench",
                epoch=datetime(2023, 1, 1, tzinfo=UTC),
            )
        ),
        "genai-duty": lambda: list(
            genai_duty.plan(
                genai_duty.read_samples(traces / "alibaba-genai-2026/pod_gpu_duty_cycle_48pods.csv"),
                cluster="bench",
            )
        ),
    }
    rows = []
    with tempfile.TemporaryDirectory() as tmp, private_platform(Path(tmp)) as settings:
        create_topics(settings.kafka)
        codec = AvroCodec(registry_client(settings.registry.url))
        for name, make in plans.items():
            start = time.perf_counter()
            events = make()
            planned = time.perf_counter() - start
            publisher = EventPublisher(settings.kafka, codec)
            start = time.perf_counter()
            replay(events, publisher)
            published = time.perf_counter() - start
            rows.append((name, len(events), len(events) / planned, len(events) / published))
    print(f"\n{'trace':<26} {'events':>8} {'plan/s':>10} {'publish/s':>10}")
    for name, count, plan_rate, publish_rate in rows:
        print(f"{name:<26} {count:>8,} {plan_rate:>10,.0f} {publish_rate:>10,.0f}")


if __name__ == "__main__":
    main()
