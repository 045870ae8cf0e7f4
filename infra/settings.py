"""Which parts of the platform GPULens starts itself, and where it keeps their state."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


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
