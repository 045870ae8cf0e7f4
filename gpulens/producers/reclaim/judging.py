"""Idle or not: a workload's workload_gpu_usage windows against the policy's checks (pure).

Why workload usage: its rows are per *top* workload (the Deployment, StatefulSet or Job that
reclaim acts on, never a ReplicaSet or a pod) and window, with the highest GPU utilization its
GPUs' samples showed; idle GPU-hours are per GPU and would have to be summed back per owner.
(A Job made by a CronJob counts for the CronJob, so its own uid has no usage: it is never
idle here, which is the safe side.)

Checks run in event time, so a backlog is judged as it happened: check ``k``
(0 = newest) looks at the instant ``end - 1 ms - k * interval_s``, where ``end`` is the newest
window end of the cluster read, and finds the workload's window holding that instant. A check
is idle when that window has samples and their highest utilization is under the threshold;
no window (nothing held or sampled), no samples, or a busy sample end the idle streak.
A workload holding no GPUs at the newest window's end is left alone: there is nothing to reclaim.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from gpulens.producers.reclaim.policy import IdleDefinition
from gpulens.schemas.model.models import WorkloadGpuUsage

IDLE, BUSY, UNMEASURED, NO_USAGE, HOLDS_NO_GPUS = "idle", "busy", "unmeasured", "no-usage", "holds-no-gpus"


@dataclass(frozen=True, slots=True)
class Judgement:
    """What the checks found about one workload."""

    reason: str
    """IDLE when every check was idle; else why the newest non-idle check was not."""
    idle_checks: int
    """Consecutive idle checks from the newest."""
    utilization_max: float | None
    """Highest utilization the checks saw, %."""

    @property
    def idle(self) -> bool:
        return self.reason == IDLE


def newest_end(rows: Iterable[WorkloadGpuUsage]) -> datetime | None:
    """How far the usage goes: the newest window end among ``rows``."""
    return max((row.window_end for row in rows), default=None)


def judge(windows: Iterable[WorkloadGpuUsage], idle: IdleDefinition, end: datetime) -> Judgement:
    """The checks of ``idle`` over one workload's ``windows``, ending at ``end``."""
    by_start = {row.window_start: row for row in windows}  # a window seen twice is the same row
    ordered = sorted(by_start.values(), key=lambda row: row.window_start)
    newest = ordered[-1] if ordered else None
    if newest is not None and newest.window_end == end and newest.gpus_allocated_end == 0:
        return Judgement(HOLDS_NO_GPUS, 0, newest.utilization_max)
    seen: list[float] = []
    for k in range(idle.checks):
        instant = end - timedelta(milliseconds=1) - timedelta(seconds=k * idle.interval_s)
        window = next((w for w in ordered if w.window_start <= instant < w.window_end), None)
        if window is None:
            reason = NO_USAGE
        elif not window.samples or window.utilization_max is None:
            reason = UNMEASURED
        else:
            seen.append(window.utilization_max)
            reason = IDLE if window.utilization_max < idle.gpu_utilization_below else BUSY
        if reason != IDLE:
            return Judgement(reason, k, max(seen, default=None))
    return Judgement(IDLE, idle.checks, max(seen, default=None))
