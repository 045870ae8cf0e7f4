"""Settings of `gpulens api` (``[api]`` in the TOML file, ``GPULENS_API__*``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, SecretStr


class ApiSettings(BaseModel):
    """Where the API listens, who may ask it, and how much one request may read."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = Field(default="127.0.0.1", description="Address the API binds (0.0.0.0: every interface).")
    port: int = Field(default=8080, ge=0, le=65535, description="Port of the API and the console.")
    token: SecretStr | None = Field(
        default=None,
        description=(
            "Bearer token every /api/ request must carry (Authorization: Bearer TOKEN); unset: no "
            "authentication. The console's static files, /healthz and /openapi.json stay public."
        ),
    )
    page_size_max: int = Field(
        default=1000, ge=1, description="Largest pageSize a paginated endpoint accepts (400 above it)."
    )
    buckets_max: int = Field(
        default=2000,
        ge=1,
        description="Most time buckets ((end - start) / step) a time series may ask for (400 above it).",
    )
    query_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="ClickHouse stops a query of the API after this long (its max_execution_time).",
    )
