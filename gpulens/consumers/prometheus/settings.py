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
            "Consumer group: names the exporter in dead letters and lag, and its state log "
            "(gpulens.exporter.<group>.changelog), which a restart resumes from. Every exporter "
            "reads every partition: replicas need a group each."
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
    checkpoint_interval_s: float = Field(
        default=5.0,
        gt=0,
        description=(
            "How often the changed series and the offsets read are written to the state log (and "
            "the group's offsets committed): what a restart reads again at most."
        ),
    )
    per_gpu: bool = Field(
        default=False,
        description=(
            "Also serve the per-GPU gauges (gpu_utilization, gpu_socket_power_watts, "
            "gpu_memory_used_bytes) from each node's newest sample batch on "
            "gpulens.state.gpu-samples.v1, which the worker's `latest` processor writes (`gpulens "
            "up` runs it when this is on). For small clusters: the node agents serve the same "
            "gauges on their own /metrics, and the exporter never reads the sample stream."
        ),
    )
    sample_tail_records: int = Field(
        default=10_000,
        ge=0,
        description=(
            "Per-GPU mode: at start, each partition of the newest-samples topic is read from at "
            "most this many records before its end, whatever the checkpoint says: samples are "
            "gauges, a backlog of older ones would only be overwritten. A node whose newest sample "
            "lies further back shows its checkpointed sample (or none, for a new group) until it "
            "reports again."
        ),
    )
