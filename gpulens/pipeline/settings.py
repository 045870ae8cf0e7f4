"""Settings of the stream worker (``[pipeline]`` in the TOML file, ``GPULENS_PIPELINE__*``).

Every option of `gpulens worker` is a field here, named as the option's parameter, its
description the option's help. A flag given on the command line wins over the file and the
environment, which win over these defaults (:func:`gpulens.cli_context.with_flags`). In a
variable, ``processors`` and ``shard`` are written as their flags take them
(``GPULENS_PIPELINE__PROCESSORS=allocation,alerts``, ``GPULENS_PIPELINE__SHARD=1/2``).
"""

from __future__ import annotations

import json
import typing
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import NoDecode

from gpulens.schemas.kafka.sharding import UNSHARDED, Shard

Processor = Literal["allocation", "workloads", "idle", "alerts", "changelog", "state", "pending", "latest"]
PROCESSORS: tuple[Processor, ...] = typing.get_args(Processor)
DEFAULT_PROCESSORS = PROCESSORS[:-1]
"""``latest`` (each node's newest samples, for the exporter's per-GPU mode) runs only when asked."""


def split_commas(text: str) -> tuple[str, ...]:
    """``"allocation, alerts"``: a list as a flag and a variable write it (processors, owner labels)."""
    return tuple(p.strip() for p in text.split(",") if p.strip())


class PipelineSettings(BaseModel):
    """What the worker computes and how it reads: windows, alert thresholds, event time, group."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    window_s: int = Field(
        default=30, ge=1, description="Allocation window size, seconds (tumbling, epoch-aligned, half-open)."
    )
    per_node: bool = Field(default=True, description="Also write node_gpu_allocation rows.")
    overview: bool = Field(
        default=True, description="Also write cluster_overview rows (reads GPU samples for utilization)."
    )
    processors: Annotated[tuple[Processor, ...], NoDecode] = Field(
        default=DEFAULT_PROCESSORS,
        min_length=1,
        description=f"Which processors to run, comma-separated, of {', '.join(PROCESSORS)}.",
    )
    latest_every_s: float = Field(
        default=15.0,
        ge=0,
        description="latest: republish a node's sample batch on gpulens.state.gpu-samples.v1 at most once "
        "per this many event-time seconds.",
    )
    idle_below: float = Field(
        default=5.0, ge=0, description="GpuIdle and idle GPU-hours: utilization threshold, percent."
    )
    idle_for: float = Field(
        default=600.0, ge=0, description="GpuIdle: how long under the threshold, seconds."
    )
    pending_for: float = Field(default=300.0, ge=0, description="GpuPodPending: how long unbound, seconds.")
    stale_after: float = Field(
        default=300.0,
        gt=0,
        description="GpuTelemetryStale: how long a node holding GPU pods may send no GPU sample, "
        "event-time seconds (Prometheus's own staleness: 5 minutes).",
    )
    idle_window_s: int = Field(
        default=3600, ge=1, description="idle: window of the idle GPU-hours rows, seconds (an hour)."
    )
    owner_labels: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description="idle: pod label keys copied onto the idle GPU-hours rows to sum by, comma-separated "
        "(team,project; in the file a list).",
    )
    compute_idle_below: float = Field(
        default=1.0,
        ge=0,
        description="idle: utilization (percent) under which a GPU whose VRAM is held counts as memory-idle.",
    )
    memory_floor_mib: int = Field(
        default=1024, ge=0, description="idle: VRAM used (MiB) from which a GPU's memory counts as held."
    )
    sample_valid_s: float = Field(
        default=300.0,
        gt=0,
        description="idle: how long a GPU sample describes its GPU when no newer one comes, seconds; "
        "after that the GPU's hours count as unmeasured.",
    )
    pile_up_pods: int = Field(
        default=5,
        ge=1,
        description="GpuPendingPileUp: GPU pods pending past pending_for (their GpuPodPending open) that, "
        "with pile_up_idle_gpus GPUs idle, open it.",
    )
    pile_up_idle_gpus: int = Field(
        default=1, ge=1, description="GpuPendingPileUp: GPUs held but idle (their GpuIdle open) it needs."
    )
    group_id: str = Field(
        default="gpulens-worker",
        min_length=1,
        description="Consumer group and transactional id; one worker per group and outputs.",
    )
    idle_ms: int = Field(
        default=3000,
        ge=0,
        description="Clusters whose sources publish no watermarks: how long a quiet input partition may "
        "hold the others back (event-time merge).",
    )
    source_timeout_s: float = Field(
        default=10.0,
        ge=0,
        description="A source silent this long (wall seconds) stops holding its cluster's event time "
        "back; a new cluster's time also waits this long for its sources to speak.",
    )
    allowed_lateness_s: float = Field(
        default=0.0,
        ge=0,
        description="Process records this many event-time seconds behind their cluster's watermark.",
    )
    hold_records: int = Field(
        default=50_000,
        ge=1,
        description="Records held for event-time order past which input partitions running ahead in "
        "event time are paused, so that a worker catching up on a backlog reads the others "
        "(watermarks among them) first. It bounds what partitions running apart make it hold, not "
        "what a barrier waits for: on noida-db, which answers a fetch with a partition's whole "
        "backlog, the worker held 190,316 records at the start of 100,000 GPUs.",
    )
    hold_decoded: int = Field(
        default=10_000,
        ge=0,
        description="Records held decoded at most: past this many held for event-time order, a "
        "record is held as its wire bytes (about 600 B, against about 8.7 KB decoded for a pod, "
        "node or inventory) and decoded when released (placed by its head alone where its source "
        "is live); 0: every one. GPU sample batches are held as they are read, by column, up "
        "to hold_columns.",
    )
    hold_columns: int = Field(
        default=200_000,
        ge=0,
        description="Records held past which GPU sample batches too are held as their wire bytes, "
        "compressed in chunks of a partition's batches (about 0.9 KB a batch of 8 GPUs, against "
        "1.6 KB uncompressed and 2.6 KB read by column), placed by their heads and read by column "
        "when released; 0: every one. Holding them so costs CPU when the worker is behind, when "
        "it can least spare it: at 100,000 GPUs on a slow machine a worker with 50,000 here never "
        "caught up on a start over 10 minutes (twice), its lag and the broker's cost growing "
        "together, while with 200,000 or 400,000 it caught up (twice), holding up to 188,000 and "
        "328,000 records.",
    )
    cycle_s: float = Field(
        default=1.0,
        gt=0,
        le=30.0,
        description="Seconds between two commits (one Kafka transaction each: outputs, state changes "
        "and input offsets) while commits are cheap; outputs become visible at their cycle's commit.",
    )
    commit_share: float = Field(
        default=0.1,
        gt=0,
        le=1.0,
        description="Under load a cycle lasts at least its last commit's time divided by this, so that "
        "commits take about this share of the worker's wall time: at fleet scale every workload's usage "
        "changes every 2 s, and a commit every second took a third of the worker at 50,000 GPUs.",
    )
    cycle_max_s: float = Field(
        default=10.0,
        gt=0,
        le=30.0,
        description="The longest a cycle stretches under load, seconds (below the transaction timeout).",
    )
    nice: int = Field(
        default=0,
        ge=0,
        le=19,
        description="Lower the worker's CPU priority by this much (nice; `gpulens up` runs it at 10): its "
        "outputs are windows, closed seconds apart, while GPU samples on their way to ClickHouse should "
        "not wait for it on a machine they share (100,000 GPUs on 2 cores, catching up on a cluster's "
        "start: the samples' p99 8.62 s, 6.62 s with the worker at 10).",
    )
    max_ahead_s: float = Field(
        default=86_400.0,
        ge=1.0,
        description="Dead-letter (event-time-out-of-bounds) a record or watermark more than this many "
        "seconds ahead of both the wall clock and its cluster's newest event time: it would close "
        "every window up to it.",
    )
    max_behind_s: float = Field(
        default=7 * 86_400.0,
        ge=0.0,
        description="Dead-letter (event-time-out-of-bounds) a record more than this many seconds behind "
        "what its cluster already processed, instead of applying it late; 0: no horizon. Records "
        "before 2000-01-01 always are.",
    )
    hanging_transaction_s: float = Field(
        default=75.0,
        ge=10.0,
        description="Embedded broker (noida-db) only: abort a transaction left open this long on a topic "
        "the worker writes, the broker answering all along (noida-db forgets open transactions when "
        "killed, and they hold every read_committed reader back). A real Kafka's coordinator aborts "
        "them itself (transaction.timeout.ms).",
    )
    compaction_min_rows: int = Field(
        default=10_000,
        ge=0,
        description="Embedded broker (noida-db, which never compacts) and an unsharded worker only: the "
        "worker compacts the gpulens.state.* topics it writes itself. It holds each live row, writes them "
        "all again once the rows written to a topic since its last rewrite outnumber them and this many, "
        "and deletes what precedes the rewrite, so a topic holds about twice its live rows. 0: never.",
    )
    shard: Annotated[Shard, NoDecode] = Field(
        default=UNSHARDED,
        description="Run N workers as 0/N .. N-1/N: shard I keeps the clusters whose name hashes to I "
        "(its consumer group and transactional ids get the suffix -IofN).",
    )
    metrics_port: int | None = Field(
        default=None, ge=1, le=65535, description="Serve Prometheus /metrics on this port."
    )
    metrics_host: str = Field(default="127.0.0.1", description="Address /metrics binds (0.0.0.0 in a pod).")

    @field_validator("processors", mode="before")
    @classmethod
    def _split_processors(cls, value: object) -> object:
        """A list, in the file or as JSON in a variable, or ``"allocation,alerts"`` as the flag
        takes it."""
        if isinstance(value, str):
            if value.lstrip().startswith("["):
                return json.loads(value)
            return split_commas(value)
        return value

    @field_validator("owner_labels", mode="before")
    @classmethod
    def _split_owner_labels(cls, value: object) -> object:
        """A list, or ``"team,project"`` as the flag and a variable take it."""
        if isinstance(value, str):
            return json.loads(value) if value.lstrip().startswith("[") else split_commas(value)
        return value

    @field_validator("shard", mode="before")
    @classmethod
    def _parse_shard(cls, value: object) -> object:
        """``"I/N"`` as the flag takes it; a wrong one fails with what to write instead."""
        return Shard.parse(value) if isinstance(value, str) else value

    @property
    def consumer_group(self) -> str:
        """The group (and transactional id prefix) the worker runs as: ``group_id``, with the
        suffix ``-IofN`` for shard I of N, so that shards never share a transactional id."""
        if self.shard.count > 1:
            return f"{self.group_id}-{self.shard.index}of{self.shard.count}"
        return self.group_id
