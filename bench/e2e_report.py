"""Figures of one :mod:`bench.e2e_scale` run, computed from the probes' series, and the tables.

Every rate and trend is taken over the *steady window*: from ``warmup`` seconds after the
start (the cluster's start, every node joining and the running pods listed at once, is a
burst the pipeline drains first) to the end of publishing. Rates are least-squares slopes of
cumulative counts over that window (a batch landing just inside or outside an edge does not
move them much); CPU is the CPU seconds spent inside it over its length.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

from bench.e2e_probes import Usage

T = TypeVar("T")

SYSTEM = ("broker", "registry", "clickhouse", "worker", "sink", "exporter", "retention")
"""The processes under test; the simulator (the GPU nodes' agents) and the benchmark are not."""
RSS_STEP_S = 60.0
START_STEP_S = 5.0
"""Step of the start's timeline (:attr:`SizeResult.start_rss`): finer, since the start's memory
rises and falls within a minute."""
START_PAST_WARMUP_S = 30.0
"""The start's timeline runs this far into the steady window."""
GROWTH_SHARE = 0.05
"""Lag grows when it rises by more than this share of the group's input rate ..."""
GROWTH_BEHIND_S = 6.0
"""... and ends more than this many seconds of input behind (batching alone: 2-4 s)."""
FLOOR_SPAN_S = 10.0
"""Lag trend and end are taken from its floor, the least lag of each span this long: a group's
lag is a saw-tooth that drops at each commit, and the worker's cycles stretch under load up to
its ``cycle_max_s`` (10 s), so a window ending in a long cycle read as growing lag."""


@dataclass(frozen=True, slots=True)
class Lag:
    """A consumer group's lag (records, end offsets minus committed) over a run."""

    start: int
    end: int
    max: int
    trend: float
    """Records/s the lag's floor rose by over the steady window (negative: it shrank)."""
    input_rate: float
    """Records/s arriving on the group's partitions over the steady window."""
    consumed_rate: float
    """Records/s the group committed over the steady window."""

    end_floor: int = 0
    """The least lag of the steady window's last span (:data:`FLOOR_SPAN_S`)."""

    @property
    def end_behind_s(self) -> float:
        return self.end / self.input_rate if self.input_rate > 0 else 0.0

    @property
    def growing(self) -> bool:
        floor_behind_s = self.end_floor / self.input_rate if self.input_rate > 0 else 0.0
        return self.trend > GROWTH_SHARE * self.input_rate and floor_behind_s > GROWTH_BEHIND_S


@dataclass(frozen=True, slots=True)
class Process:
    """One process (tree) over a run."""

    cpu_pct: float
    """Percent of one core over the steady window (this machine has 2)."""
    peak_rss_mb: float
    """VmHWM: the most it ever held."""


@dataclass
class SizeResult:
    """Everything measured for one fleet size."""

    nodes: int
    gpus: int
    interval_s: float
    duration_s: float
    offered_records_s: float = 0.0
    offered_samples_s: float = 0.0
    sink_rows_s: float = 0.0
    worker_records_s: float = 0.0
    p50_s: float = math.nan
    p99_s: float = math.nan
    max_s: float = math.nan
    sim_late_p99_s: float = math.nan
    p99_by_minute: list[tuple[float, float]] = field(default_factory=list)
    """Per minute of the steady window (by event time): e2e p99 and the simulator's late p99,
    to tell a slow start from a steady shortfall."""
    sim_prime_s: float = 0.0
    sim_prime_overrun_s: float = 0.0
    published_records: int = 0
    published_samples: int = 0
    rows_visible: int = 0
    rows_complete_after_s: float | None = None
    """Seconds after publishing ended until every published sample was a visible row."""
    worker_caught_up_after_s: float | None = None
    lag: dict[str, Lag] = field(default_factory=dict)
    processes: dict[str, Process] = field(default_factory=dict)
    total_rss_peak_mb: float = 0.0
    """Most RSS held at once by the :data:`SYSTEM` processes together (sampled every second)."""
    steady_rss_peak_mb: float = 0.0
    """Most RSS held at once by the :data:`SYSTEM` processes within the steady window: the goal's
    "through a steady run", the start's burst left out (sampled every second)."""
    steady_rss_peak_at_s: float | None = None
    """Seconds from the simulator's start to that moment (None: no sample in the window)."""
    steady_rss_peak_of: dict[str, int] = field(default_factory=dict)
    """Each process's RSS (MB) at that moment: whose highs coincided."""
    steady_rss_spread: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Each process's RSS (MB) within the steady window, median and most (sampled every second):
    which one's highs come and go (a broker save, a merge) and which one's level is high."""
    over_rss_limit_until_s: float | None = None
    """Seconds from the simulator's start to the last instant of the steady window at which the
    system held more than the RSS bound (None: never): a start still being digested when the
    window opens is over it only at first, a broker save or a lag anywhere in the window."""
    total_pss_peak_mb: float = 0.0
    """The same in PSS (sampled every 10 s): the memory they take together, a page shared by
    several of them counted once."""
    machine_busy_pct: float = 0.0
    """CPU the whole machine used over the steady window, % of one core (this one has 2)."""
    others_pct: float = 0.0
    """Of which processes this benchmark did not start (other work on the machine)."""
    poll_query_ms_p50: float = 0.0
    full_polls: int = 0
    """Visibility polls that grouped the whole table (:class:`bench.e2e_probes.RowPoller`)."""
    rss_over_time: dict[str, list[int]] = field(default_factory=dict)
    """RSS (MB, VmRSS) of the broker, the worker and the system under test together, every
    :data:`RSS_STEP_S` from the simulator's start."""
    pss_over_time: list[int] = field(default_factory=list)
    """The same for the system's PSS (read every 10 s)."""
    start_rss: dict[str, list[int]] = field(default_factory=dict)
    """As :attr:`rss_over_time`, every :data:`START_STEP_S` from the simulator's start to
    :data:`START_PAST_WARMUP_S` into the steady window: how the start's memory rises and falls."""
    start_lag: list[int] = field(default_factory=list)
    """The worker's lag (records) at the same instants."""
    machine_loop_s: float = math.nan
    """CPU seconds of :mod:`bench.machine_speed`'s fixed loop just before the size ran: which kind
    of machine the figures came from."""
    worker_cycles: int | None = None
    """Cycles the worker committed over the steady window (its ``gpulens_worker_cycles_total``
    read at both ends): each is one transaction, and cycles stretch under load."""
    worker_commit_s: float | None = None
    """The worker's last commit's time at the end of the steady window (``gpulens_worker_commit_seconds``)."""
    worker_held_peak: int = 0
    """The most records the worker held for event-time order at once since it started, read at
    the end of the steady window (``gpulens_worker_buffered_records_peak``)."""
    dropped: dict[str, int] = field(default_factory=dict)
    """Per topic, records the retention cap deleted before every group had consumed them (the
    retention job's counter at the end of the run)."""
    profiles: dict[str, str] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return "ok" if not self.failures else "; ".join(self.failures)


def quantile(weighted: Sequence[tuple[float, int]], q: float) -> float:
    """The ``q`` quantile of values with integer weights (``inf`` allowed)."""
    total = sum(w for _, w in weighted)
    if total == 0:
        return math.nan
    rank, running = q * total, 0
    for value, weight in sorted(weighted):
        running += weight
        if running >= rank:
            return value
    return sorted(weighted)[-1][0]


def slope(points: Iterable[tuple[float, float]]) -> float:
    """Least-squares slope of ``points``; 0 with fewer than two distinct times."""
    pts = list(points)
    if len(pts) < 2:
        return 0.0
    mean_t = sum(t for t, _ in pts) / len(pts)
    mean_v = sum(v for _, v in pts) / len(pts)
    var = sum((t - mean_t) ** 2 for t, _ in pts)
    return sum((t - mean_t) * (v - mean_v) for t, v in pts) / var if var else 0.0


def within(series: Sequence[tuple[float, object]], begin: float, end: float) -> list[tuple[float, object]]:
    return [(t, v) for t, v in series if begin <= t <= end]


def lag_of(
    series: Sequence[tuple[float, dict[str, tuple[int, int]]]],
    name: str,
    begin: float,
    end: float,
    run_end: float,
) -> Lag:
    """Lag figures of group ``name`` from the offset sampler's series."""
    points = [(t, v[name]) for t, v in series if name in v]
    steady = [(t, c, e) for t, (c, e) in points if begin <= t <= end]
    everything = [e - c for t, (c, e) in points if t <= run_end]
    if not steady:
        return Lag(0, 0, max(everything, default=0), 0.0, 0.0, 0.0)
    floor = lag_floor([(t, e - c) for t, c, e in steady], FLOOR_SPAN_S)
    return Lag(
        start=steady[0][2] - steady[0][1],
        end=steady[-1][2] - steady[-1][1],
        max=max(everything, default=0),
        trend=slope(floor),
        input_rate=slope((t, e) for t, _, e in steady),
        consumed_rate=slope((t, c) for t, c, _ in steady),
        end_floor=floor[-1][1],
    )


def lag_floor(points: Sequence[tuple[float, int]], span_s: float) -> list[tuple[float, int]]:
    """The least lag of each ``span_s`` of ``points`` (counted back from the last point, so the
    last span is whole), at the time of that least lag."""
    spans: dict[int, tuple[int, float]] = {}
    last = points[-1][0]
    for t, lag in points:
        span = math.floor((last - t) / span_s)
        if span not in spans or lag < spans[span][0]:
            spans[span] = (lag, t)
    return sorted((t, lag) for lag, t in spans.values())


def processes_of(
    series: Sequence[tuple[float, dict[str, Usage]]], begin: float, end: float
) -> dict[str, Process]:
    """CPU over the steady window and peak RSS of each process in the sampler's series."""
    result: dict[str, Process] = {}
    names = {name for _, found in series for name in found}
    for name in sorted(names):
        points = [(t, u) for t, u in ((t, found.get(name)) for t, found in series) if u is not None]
        inside = [(t, u) for t, u in points if begin <= t <= end]
        cpu = 0.0
        if len(inside) >= 2:
            (t0, u0), (t1, u1) = inside[0], inside[-1]
            cpu = 100 * (u1.cpu_s - u0.cpu_s) / (t1 - t0) if t1 > t0 else 0.0
        result[name] = Process(cpu, max(u.hwm_kb for _, u in points) / 1024)
    return result


def rss_over_time(
    series: Sequence[tuple[float, dict[str, Usage]]], start: float, end: float, step: float = RSS_STEP_S
) -> dict[str, list[int]]:
    """RSS (MB) of each of the :data:`SYSTEM` processes and of all of them together at each
    ``step`` from ``start`` to ``end``: the sample nearest each instant."""
    if not series:
        return {}
    found_at = nearest(series, steps(start, end, step))

    def mb(found: dict[str, Usage], names: Sequence[str]) -> int:
        return round(sum(found[n].rss_kb for n in names if n in found) / 1024)

    each = {name: [mb(found, [name]) for found in found_at] for name in SYSTEM}
    return {**each, "system": [mb(found, SYSTEM) for found in found_at]}


def rss_spread(
    series: Sequence[tuple[float, dict[str, Usage]]], start: float, end: float
) -> dict[str, tuple[int, int]]:
    """Median and most RSS (MB) of each of the :data:`SYSTEM` processes from ``start`` to ``end``."""
    spread: dict[str, tuple[int, int]] = {}
    for name in SYSTEM:
        mb = sorted(found[name].rss_kb / 1024 for t, found in series if start <= t <= end and name in found)
        if mb:
            spread[name] = round(mb[len(mb) // 2]), round(mb[-1])
    return spread


def pss_over_time(series: Sequence[tuple[float, dict[str, Usage]]], start: float, end: float) -> list[int]:
    """The :data:`SYSTEM` processes' PSS together (MB) at each :data:`RSS_STEP_S` from ``start``
    to ``end``: the sample that read it nearest each instant."""
    measured = [point for point in series if system_pss_kb(point[1]) is not None]
    return [round((system_pss_kb(found) or 0) / 1024) for found in nearest(measured, steps(start, end))]


def steps(start: float, end: float, step: float = RSS_STEP_S) -> list[float]:
    """Every ``step`` from ``start`` to ``end``, both ends included where they fall on one."""
    return [start + i * step for i in range(int((end - start) // step) + 1)]


def nearest(series: Sequence[tuple[float, T]], instants: Sequence[float]) -> list[T]:
    """The sample of a time series nearest each of ``instants`` (none if it is empty)."""
    return [min(series, key=partial(_distance, at))[1] for at in instants if series]


def _distance(at: float, point: tuple[float, object]) -> float:
    return abs(point[0] - at)


def system_pss_kb(found: dict[str, Usage]) -> int | None:
    """The :data:`SYSTEM` processes' PSS together; None in a sample that did not read it."""
    values = [found[n].pss_kb for n in SYSTEM if n in found]
    return None if not values or None in values else sum(v or 0 for v in values)


def machine_of(
    machine: Sequence[tuple[float, float, float]], processes: dict[str, Process], begin: float, end: float
) -> tuple[float, float]:
    """The machine's busy CPU over the window and the part of it none of ``processes`` used (% of a core)."""
    inside = [(t, busy) for t, busy, _ in machine if begin <= t <= end]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return 0.0, 0.0
    busy = 100 * (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])
    return busy, max(0.0, busy - sum(p.cpu_pct for p in processes.values()))


def first_time(series: Sequence[tuple[float, bool]], after: float) -> float | None:
    """Seconds after ``after`` of the first point at or after it whose flag is true."""
    for t, ok in series:
        if t >= after and ok:
            return t - after
    return None


# --- tables --------------------------------------------------------------------------------------


def _num(value: float, digits: int = 0) -> str:
    if math.isnan(value):
        return "-"
    if math.isinf(value):
        return "inf"
    return f"{value:,.{digits}f}"


def _lag(lag: Lag | None) -> str:
    if lag is None:
        return "-"
    mark = " **growing**" if lag.growing else ""
    return (
        f"{lag.start:,} → {lag.end:,} (max {lag.max:,}); {lag.trend:+,.0f}/s, "
        f"{lag.end_behind_s:.1f} s behind{mark}"
    )


def _size(r: SizeResult) -> str:
    return f"{r.gpus:,} ({r.nodes:,} nodes)"


def tables(results: Sequence[SizeResult], order: Sequence[str]) -> str:
    """Three Markdown tables, one row per size: throughput and latency, lag, processes."""
    lines = [
        "| GPUs | offered records/s | offered GPU samples/s | rows/s into gpu_samples | worker records/s "
        "| e2e p50 s | e2e p99 s | e2e max s | simulator late p99 s | rows / published | all rows after s "
        "| verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        after = "-" if r.rows_complete_after_s is None else f"{r.rows_complete_after_s:.1f}"
        cells = [
            _size(r),
            *(_num(v) for v in (r.offered_records_s, r.offered_samples_s, r.sink_rows_s, r.worker_records_s)),
            *(_num(v, 2) for v in (r.p50_s, r.p99_s, r.max_s, r.sim_late_p99_s)),
            f"{r.rows_visible:,} / {r.published_samples:,}",
            after,
            r.verdict,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "| GPUs | worker lag: start → end (max); trend | sink lag: start → end (max); trend |",
        "|---|---|---|",
    ]
    for r in results:
        lines.append(f"| {_size(r)} | {_lag(r.lag.get('worker'))} | {_lag(r.lag.get('sink'))} |")
    names = [n for n in order if any(n in r.processes for r in results)]
    header = [
        "GPUs", *names, "system CPU %", "system RSS MB (at once)", "system PSS MB (at once)",
        "machine busy % (others)",
    ]  # fmt: skip
    lines += ["", "| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for r in results:
        cells = [
            f"{r.processes[n].cpu_pct:.0f} % / {r.processes[n].peak_rss_mb:,.0f} MB"
            if n in r.processes
            else "-"
            for n in names
        ]
        total_cpu = sum(p.cpu_pct for n, p in r.processes.items() if n in SYSTEM)
        lines.append(
            f"| {_size(r)} | " + " | ".join(cells) + f" | {total_cpu:.0f} % | {r.total_rss_peak_mb:,.0f} "
            f"| {r.total_pss_peak_mb:,.0f} | {r.machine_busy_pct:.0f} % ({r.others_pct:.0f} %) |"
        )
    return "\n".join(lines)
