"""Settings of the Prometheus exporter (``[exporter]`` in the TOML file, ``GPULENS_EXPORTER__*``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ExporterSettings(BaseModel):
    """Where the exporter serves ``/metrics`` and how it reads the derived topics."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = Field(default="127.0.0.1", description="Address /metrics binds (0.0.0.0: every interface).")
    port: int = Field(default=19464, ge=0, le=65535, description="Port of /metrics (0: any free port).")
    group_id: str = Field(
        default="gpulens-exporter",
        min_length=1,
        description=(
            "Consumer group: names the exporter in dead letters and lag. Every exporter reads every "
            "partition from the beginning (state is rebuilt, not resumed), so replicas may share it."
        ),
    )
    workload_max_age_windows: int = Field(
        default=2,
        ge=1,
        description=(
            "A workload's series disappear once its newest row is more than this many windows older "
            "than the newest workload row of its cluster (the workload ended)."
        ),
    )
    poll_records: int = Field(default=5_000, ge=1, description="Most records decoded per batch.")
    lag_interval_s: float = Field(
        default=5.0, gt=0, description="How often lag is measured (a broker round trip per partition)."
    )
