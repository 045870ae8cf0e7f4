"""Which parts of the platform GPULens starts itself, and where it keeps their state."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gpulens.infra.python_allocator import PythonAllocator


class PlatformSettings(BaseModel):
    """The embedded platform: what `gpulens infra up` starts on this machine."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    state_dir: Path = Field(
        default=Path(".gpulens"), description="Pid files, logs, broker data and the ClickHouse engine."
    )
    broker: Literal["noida", "tansu", "external"] = Field(
        default="noida",
        description=(
            "Kafka broker to start on kafka.bootstrap_servers: noida (noida-db, default: correct "
            "offsets, transactions, persistence), tansu (fast, memory only), or external (start none)."
        ),
    )
    registry: Literal["embedded", "external"] = Field(
        default="embedded",
        description="Start the embedded schema registry on registry.url, or use an external one.",
    )
    clickhouse: Literal["embedded", "external"] = Field(
        default="embedded",
        description="Hold the embedded chDB engine, serve it on clickhouse.http_port; or use clickhouse.url.",
    )
    start_timeout_s: float = Field(default=60.0, gt=0, description="How long a service may take to be ready.")
    broker_save_share: float = Field(
        default=0.05,
        gt=0,
        le=1.0,
        description=(
            "noida-db only: about this share of its saving thread's time goes to saving everything "
            "the broker holds (`make install` builds the library that paces it): each pause between "
            "two saves lasts the last save's CPU times (1 - share) / share, at least noida-db's own "
            "1 s; 1: noida-db's own pace. At 100,000 GPUs saving took 31 % of a core at noida-db's "
            "pace. A SIGKILL of the broker loses what was acknowledged since the last save began, "
            "which the producers resend (they keep 120 s of it); a clean stop saves everything."
        ),
    )
    broker_save_pause_max_s: float = Field(
        default=30.0,
        ge=1.0,
        le=110.0,
        description="noida-db only: the longest pause between two saves, seconds (what a SIGKILL may "
        "lose grows with it; the producers resend the last 120 s).",
    )
    python_allocator: PythonAllocator = Field(
        default="jemalloc",
        description=(
            "Allocator of the worker, the sink and the exporter as `gpulens up` runs them: jemalloc "
            "(where `make install` or the system provides libjemalloc.so.2; else pymalloc) hands "
            "freed memory back page by page (the worker at 20,000 GPUs: 193 MB against 242 at the "
            "same CPU); pymalloc: CPython's own."
        ),
    )


class RetentionSettings(BaseModel):
    """Retention on the embedded broker (``[retention]``, ``GPULENS_RETENTION__*``).

    noida-db holds every record it keeps in memory, so what the pipeline has consumed must go
    soon: every ``interval_s`` `gpulens retention` deletes, per partition of each catalog topic
    with ``cleanup.policy=delete``, the records every consumer group has committed past and
    that are older than ``keep_s`` (or the catalog's ``retention.ms`` when that is shorter),
    and past ``max_records_per_partition`` the oldest records whoever still needs them.
    Compacted topics are never truncated. An external Kafka cluster keeps its own retention.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    interval_s: float = Field(
        default=5.0,
        ge=0,
        description="Seconds between passes; 0: no retention job with `gpulens up`. Between two passes "
        "the broker holds what was consumed meanwhile, and rewrites it all at each of its saves.",
    )
    keep_s: float = Field(
        default=2.0,
        ge=0,
        description=(
            "A consumed record stays at least this long (by its timestamp) for readers outside the "
            "pipeline's groups (a group's own reads are held back until it commits, whatever this "
            "says); the broker's memory and CPU grow with it (at 20,000 GPUs: 46 MB and 37 % of a "
            "core keeping 10 s and cutting every 10 s, 37 MB and 29 % keeping 2 s and cutting every 5 s)."
        ),
    )
    max_records_per_partition: int = Field(
        default=50_000,
        ge=0,
        description=(
            "Most records a partition keeps, consumed or not (0: no cap): a group further behind "
            "loses its oldest records (logged, gpulens_retention_dropped_records_total), so that "
            "a consumer that cannot keep up does not take the broker's memory, and the machine, "
            "with it. 50,000 records of gpulens.gpu.samples.v1 are 4 minutes at 20,000 GPUs, "
            "48 s at 100,000."
        ),
    )
    cap_spares_s: float = Field(
        default=60.0,
        ge=0,
        description=(
            "Records younger than this stay even past max_records_per_partition: a burst (a "
            "100,000-GPU cluster's start writes 200,000 device changes at once, 67,000 on each of "
            "3 partitions) gets this long to be consumed; past the cap a partition then holds at "
            "most what arrives in this time."
        ),
    )
    ignored_groups: tuple[str, ...] = Field(
        default=("gpulens-smoke-",),
        description=(
            "Name prefixes of consumer groups that read once and leave (the smoke check): their "
            "committed offsets never hold records back."
        ),
    )
    metrics_host: str = Field(default="127.0.0.1", description="Address the job's /metrics binds.")
    metrics_port: int = Field(
        default=19466, ge=0, le=65535, description="Port of the job's /metrics (0: not served)."
    )
