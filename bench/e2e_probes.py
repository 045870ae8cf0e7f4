"""What :mod:`bench.e2e_scale` watches while a run goes: processes, consumer offsets, visible rows.

Each probe samples in a background thread of the benchmark process and keeps a time series
(wall clock, ``time.time()``), analysed after the run by :mod:`bench.e2e_report`.

* :class:`ProcessSampler` reads ``/proc`` (psutil is not installed): CPU seconds (utime + stime
  of ``/proc/PID/stat``), ``VmRSS`` and ``VmHWM`` of ``/proc/PID/status``, summed over the
  process and the descendants it had when registered (a launcher that spawns the real binary
  is measured through its child).
* :class:`OffsetSampler` reads each consumer group's committed offsets and the partitions'
  end offsets (high watermarks) from the broker: lag = end - committed, what
  ``gpulens_consumer_lag_records`` reports.
* :class:`RowPoller` asks ClickHouse how many ``gpu_samples`` rows of one cluster are visible
  per event time, and remembers when each row was first seen.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, TopicPartition

from gpulens.consumers.clickhouse.client import get_client
from gpulens.consumers.clickhouse.settings import ClickHouseSettings
from gpulens.schemas.kafka.settings import KafkaSettings

log = logging.getLogger(__name__)

_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Usage:
    """One process tree at one instant."""

    cpu_s: float
    """user + system CPU seconds since it started."""
    rss_kb: int
    hwm_kb: int
    """Peak RSS (VmHWM), summed over the tree's processes."""
    pss_kb: int | None = None
    """Proportional set size, when asked for: RSS with each page shared by N processes counted
    1/N in each (a library's code mapped by every Python process counts once in their sum)."""


def _stat_fields(pid: int) -> list[str]:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2 :].split()  # fields from the 3rd (state) on; comm may hold spaces


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid``."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                children.setdefault(int(_stat_fields(int(entry.name))[1]), []).append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def usage(pids: Sequence[int], *, pss: bool = False) -> Usage | None:
    """CPU and memory of ``pids`` together, with their PSS if ``pss`` (the kernel walks every
    page to tell it: a few ms per large process); None when none of them is alive."""
    cpu, rss, hwm, alive = 0.0, 0, 0, False
    proportional: int | None = 0 if pss else None
    for pid in pids:
        try:
            fields = _stat_fields(pid)
            status = Path(f"/proc/{pid}/status").read_text()
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text() if pss else ""
        except (OSError, ValueError):
            continue
        if fields[0] == "Z":
            continue
        alive = True
        cpu += (int(fields[11]) + int(fields[12])) / _TICK
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                rss += int(line.split()[1])
            elif line.startswith("VmHWM:"):
                hwm += int(line.split()[1])
        if proportional is not None:
            proportional += sum(
                int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss:")
            )
    return Usage(cpu, rss, hwm, proportional) if alive else None


class _Sampler:
    """A daemon thread calling :meth:`sample` every ``every_s`` seconds until stopped."""

    def __init__(self, every_s: float) -> None:
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=type(self).__name__, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.sample()  # one last look

    def sample(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                self.sample()
            except Exception:  # a probe must never end the run: the gap shows in the series
                log.exception("%s failed", type(self).__name__)
            self._stop.wait(max(0.0, self._every_s - (time.monotonic() - began)))


class ProcessSampler(_Sampler):
    """CPU and memory of named processes (each with the descendants it has when added)."""

    def __init__(self, every_s: float = 1.0, pss_every_s: float = 10.0) -> None:
        """Sample every ``every_s``, PSS too every ``pss_every_s`` (read every second, it cost
        the benchmark 4 % of a core)."""
        super().__init__(every_s)
        self._pss_every_s = pss_every_s
        self._pss_at = -math.inf
        self._trees: dict[str, list[int]] = {}
        self._lock = threading.Lock()
        self.series: list[tuple[float, dict[str, Usage]]] = []
        self.machine: list[tuple[float, float, float]] = []
        """(time, busy CPU seconds, all CPU seconds) of the whole machine, from /proc/stat."""

    def add(self, name: str, pid: int, *, children: bool = True) -> None:
        """Watch ``pid`` as ``name``, with the descendants it has now unless ``children`` is False."""
        with self._lock:
            self._trees[name] = [pid, *(descendants(pid) if children else ())]

    @property
    def names(self) -> list[str]:
        return list(self._trees)

    def sample(self) -> None:
        with self._lock:
            trees = dict(self._trees)
        now = time.time()
        pss = now - self._pss_at >= self._pss_every_s
        self._pss_at = now if pss else self._pss_at
        found = {name: u for name, pids in trees.items() if (u := usage(pids, pss=pss)) is not None}
        self.series.append((now, found))
        ticks = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
        idle = ticks[3] + ticks[4]  # idle + iowait
        self.machine.append((now, (sum(ticks) - idle) / _TICK, sum(ticks) / _TICK))


class OffsetSampler(_Sampler):
    """Committed and end offsets of consumer groups over given partitions."""

    def __init__(
        self, kafka: KafkaSettings, groups: dict[str, tuple[str, list[TopicPartition]]], every_s: float = 1.0
    ) -> None:
        super().__init__(every_s)
        self._groups = groups
        self._consumers = {
            name: Consumer(kafka.librdkafka(**{"group.id": group, "enable.auto.commit": False}))
            for name, (group, _) in groups.items()
        }
        self.series: list[tuple[float, dict[str, tuple[int, int]]]] = []
        """(time, {name: (committed, end)}), summed over the group's partitions."""

    def sample(self) -> None:
        any_consumer = next(iter(self._consumers.values()))
        ends: dict[tuple[str, int], tuple[int, int]] = {}
        found: dict[str, tuple[int, int]] = {}
        now = time.time()
        try:
            for name, (_, partitions) in self._groups.items():
                committed = self._consumers[name].committed(partitions, timeout=10)
                done = end = 0
                for tp in committed:
                    key = (tp.topic, tp.partition)
                    if key not in ends:
                        ends[key] = any_consumer.get_watermark_offsets(
                            TopicPartition(*key), timeout=10, cached=False
                        )
                    low, high = ends[key]
                    done += tp.offset if tp.offset >= 0 else low
                    end += high
                found[name] = (done, end)
        except KafkaException as err:
            log.warning("offsets not read: %s", err)
            return
        self.series.append((now, found))

    def stop(self) -> None:
        super().stop()
        for consumer in self._consumers.values():
            consumer.close()


class RowPoller(_Sampler):
    """``gpu_samples`` rows of one cluster visible in ClickHouse, by event time, every ``every_s``.

    A row's visibility time is the wall clock when the poll that first counted it was sent:
    it became visible at most one interval earlier (the figure is an upper bound by up to
    ``every_s``).

    Each poll groups only the rows inserted in the last ``RECENT_S`` (``inserted_at``, second by
    second, so a row is counted once): grouping the whole table every half second cost the
    ClickHouse holder, beside the pipeline it measures, more the longer a run went (the query's
    p50 99 ms in a 10-minute run at 100,000 GPUs, 20 ms in a 2-minute one). A cheap count of
    the whole table checks it: rows visible that the recent ones do not account for (an insert
    that took longer than ``RECENT_S`` to become visible) send that poll over the whole table.
    """

    RECENT_S = 60
    QUERY = (
        "SELECT toUInt32(inserted_at) AS s, toUnixTimestamp64Milli(event_time) AS t, count() AS n "
        "FROM gpu_samples WHERE cluster = {cluster:String} AND inserted_at >= toDateTime({since:UInt32}) "
        "GROUP BY s, t"
    )
    COUNT = "SELECT count() FROM gpu_samples WHERE cluster = {cluster:String}"

    def __init__(self, clickhouse: ClickHouseSettings, cluster: str, every_s: float = 0.5) -> None:
        super().__init__(every_s)
        self._client = get_client(clickhouse, database=clickhouse.database)
        self._cluster = cluster
        self._seen: dict[tuple[int, int], int] = {}
        """Rows seen so far by (second inserted, event time ms)."""
        self._newest_s = 0
        """The newest second a row seen was inserted in."""
        self.arrivals: list[tuple[int, float, int]] = []
        """(event time ms, wall time of the poll that first saw them, rows)."""
        self.totals: list[tuple[float, int]] = []
        """(poll wall time, rows visible)."""
        self.query_s: list[float] = []
        self.full_polls = 0
        """Polls that had to group the whole table (class docstring)."""
        self.errors = 0

    @property
    def visible(self) -> int:
        return self.totals[-1][1] if self.totals else 0

    def sample(self) -> None:
        sent = time.time()
        try:
            count = self._client.query(self.COUNT, parameters={"cluster": self._cluster})
            total = int(count.result_rows[0][0])
            visible = self.visible
            if total > visible:
                visible += self._count_new(sent, max(0, self._newest_s - self.RECENT_S))
            if total > visible:
                self.full_polls += 1
                visible += self._count_new(sent, 0)
            self.totals.append((sent, visible))
        except Exception as err:  # the endpoint is busy or away: count it, look again next time
            self.errors += 1
            log.warning("visibility poll failed: %s", err)
            return
        self.query_s.append(time.time() - sent)

    def _count_new(self, sent: float, since: int) -> int:
        """Rows inserted from second ``since`` on not seen before, noted as arriving at ``sent``."""
        parameters = {"cluster": self._cluster, "since": since}
        rows = self._client.query(self.QUERY, parameters=parameters).result_rows
        counted = 0
        for second, at, count in rows:
            key = (int(second), int(at))
            new = int(count) - self._seen.get(key, 0)
            if new > 0:
                self.arrivals.append((key[1], sent, new))
                self._seen[key] = int(count)
                self._newest_s = max(self._newest_s, key[0])
                counted += new
        return counted

    def stop(self) -> None:
        super().stop()
        self._client.close()
