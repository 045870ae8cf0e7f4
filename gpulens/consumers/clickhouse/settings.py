"""How GPULens reaches ClickHouse, and how the embedded engine is held and served."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr


class ClickHouseSettings(BaseModel):
    """ClickHouse: a server by URL, or the embedded chDB engine served over HTTP by its holder."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str = Field(
        default="http://127.0.0.1:18123",
        pattern=r"^(https?|chdb)://",
        description=(
            "Where to run SQL: http(s)://host:port for a ClickHouse server (or the embedded "
            "engine's HTTP endpoint), chdb://PATH to open the engine in-process (one process only)."
        ),
    )
    database: str = Field(default="gpulens", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="Database.")
    username: str = Field(default="default", description="User for a ClickHouse server.")
    password: SecretStr = Field(default=SecretStr(""), description="Password for a ClickHouse server.")
    embedded_path: Path | None = Field(
        default=None,
        description="chDB data directory of the embedded engine (default: STATE_DIR/clickhouse).",
    )
    http_host: str = Field(default="127.0.0.1", description="Address the embedded engine's endpoint binds.")
    http_port: int = Field(default=18123, ge=1, le=65535, description="Port of that endpoint.")
    http_max_sessions: int = Field(
        default=1000,
        ge=1,
        description=(
            "HTTP sessions (session_id) the endpoint keeps at once (~110 KB each; clickhouse-connect "
            "opens one per client); past it a new session is refused until one ends or expires."
        ),
    )


class SinkSettings(BaseModel):
    """How the ClickHouse sink batches, retries and keeps GPU samples."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    batch_rows: int = Field(
        default=100_000,
        ge=1,
        description="Write a batch once it holds this many rows (over all tables): few large inserts.",
    )
    batch_seconds: float = Field(
        default=1.0,
        gt=0,
        description="Write a batch at the latest this long after its first record (latency vs insert size).",
    )
    state_batch_seconds: float = Field(
        default=5.0,
        gt=0,
        description=(
            "Write the tables of everything but GPU samples (pods, workloads, nodes, containers, their "
            "events) at the latest this long after their first record: each write costs ClickHouse a "
            "part per table and its merges however few rows it holds (python -m bench.insert_cost)."
        ),
    )
    retry_backoff_s: tuple[float, ...] = Field(
        default=(0.2, 0.5, 1.0, 2.0, 5.0),
        min_length=1,
        description=(
            "Delays between attempts while ClickHouse is unreachable or busy; the last one repeats "
            "until it answers or the sink is stopped (offsets stay uncommitted meanwhile)."
        ),
    )
    samples_ttl_days: int = Field(
        default=30,
        ge=1,
        description="Days gpu_samples rows are kept after insertion (the table's TTL, applied by migrate).",
    )
    group_id: str = Field(default="gpulens-clickhouse-sink", min_length=1, description="Consumer group.")
    decode_in_clickhouse: bool = Field(
        default=True,
        description=(
            "Hand GPU sample batches and device changes to ClickHouse undecoded (INSERT ... FORMAT "
            "AvroConfluent, about ten times cheaper than decoding them in Python); false: the sink "
            "decodes every record."
        ),
    )
    clickhouse_registry_url: str | None = Field(
        default=None,
        pattern=r"^https?://",
        description=(
            "The schema registry as ClickHouse reaches it (its format_avro_schema_registry_url, to "
            "fetch writer schemas by id); default: registry.url. A ClickHouse server on another host "
            "must be able to reach this address."
        ),
    )
    duplicate_horizon: int = Field(
        default=500_000,
        ge=2,
        description=(
            "Recent event ids remembered (by hash, about 35 bytes each) to dead-letter a conflicting "
            "duplicate (same event_id, other content) and keep the first; older conflicts replace the row."
        ),
    )
