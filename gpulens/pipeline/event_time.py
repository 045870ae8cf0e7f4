"""Each cluster's event time, from the watermarks its sources publish.

A source (a watcher, an agent, the gateway, a replay) publishes ``Watermark(cluster, source,
event_time=T)`` after the broker acknowledged every record of its with an event time below
``T``. How far the worker may process a cluster is then a fact the sources state, not a guess
from partitions that look empty (two runs of one replay gave different alerts that way).

Rules, per cluster:

- A watermark read is not trusted at once: records acknowledged before it was produced may
  sit in partitions the consumer has not fetched that far. It takes effect once every input
  partition has been fetched up to its *barrier*: the end offsets asked for after it was
  read (in one request, in the background), or, where the partition's records say so, the
  first record stamped ``CLOCK_SKEW_MS`` after the watermark itself was produced (its source
  stamped its earlier records before it, and the other producers' clocks agree within the
  skew). So a worker catching up on a backlog releases as it reads, instead of holding
  everything read until the backlog's end: memory follows the skew allowance, not the
  backlog. The second bound needs no question: a partition the worker has fetched a record
  of stamped at or after that instant is past the first such record, which is where the
  broker would have said (``ListOffsets`` by time) they begin. Asking the broker instead, one
  question in flight at a time, cost it what it held per answer, and at 100,000 GPUs the
  answers came seconds late: a watermark waited on end offsets far ahead of the fetch while
  the worker held what it read meanwhile (153,000-224,000 records).
- A source is *live* from the first record or watermark heard from it until it sends a final
  watermark or stays silent for ``source_timeout_s`` of wall time. A live source none of whose
  watermarks has taken effect yet holds the cluster back entirely while its first watermark
  waits for its barrier, and for ``source_timeout_s`` after the worker first heard of it (its
  first watermark may be on its way: an agent vouches before its second round). Past that, a
  source that never sent a watermark is left out (the *grace rule*): an agent too old to send
  watermarks, or one whose records carry a source its watermarks do not name, must not stop
  its cluster; its records are then released by the other sources' time.
- The cluster's event time is the smallest effective watermark of its live sources. With no
  live source: unbounded once every source it knows has sent its final watermark (the cluster
  has *ended*), else the largest effective watermark any source gave.
- Which sources publish watermarks: replays and the simulator (at their event time), the
  Kubernetes watcher (the wall clock less ``watermark_lag_s``, every ``watermark_interval_s``),
  each node agent (source ``<source>/<node>``: the newest event time it sent, once the broker
  acknowledged everything it sent), directly or through the ingest gateway (which produces a
  batch's watermarks after the rest of the batch is acknowledged).
- A source the worker has not heard of yet cannot hold anything back, so a cluster's time
  stays put for ``source_timeout_s`` after the worker first hears of it: every source that
  exists has spoken by then, or counts as silent. A cluster restored from a checkpoint knows
  its sources already and does not wait, nor does it give a source that had sent no watermark
  before the restart a new grace.
- Records are released below the cluster's time minus ``allowed_lateness_ms``.
- A cluster none of whose sources ever sent a watermark has no event time here (``None``):
  the worker falls back to its partition rule (:mod:`gpulens.pipeline.merging`).

Bounds (:class:`EventTimeBounds`), checked before a record reaches the clocks or a merge: a
record or watermark whose time lies further ahead than ``max_ahead_ms`` of both the wall clock
and the cluster's newest time (released or vouched for by a watermark), or a record further
than ``max_behind_ms`` behind what its cluster already released, is out of bounds: the worker
dead-letters it, and it moves no clock. (Times before 2000 or from 2100 on never get here: the
models refuse them at decoding, as ``invalid-record``.)
Ahead is measured from the greater of the two so that a replay of a past trace (its cluster's
time far behind the wall clock) and a cluster whose clock runs ahead of the worker's both pass.
Behind is measured from the cluster's released time only: a state change within the horizon is
still applied (restamped), one older than it would put long-superseded state back.

Scale: a cluster may have thousands of sources (one per agent: 12,500 at 100,000 GPUs), so no
worker step costs sources times partitions. End offsets are asked for at most every
``BARRIER_EVERY_S``, and every watermark read since shares that one barrier; each barrier is
checked once per :meth:`EventClocks.settle` (what its partitions' records vouch for: one instant),
which visits only the sources with watermarks waiting. A cluster's
time is computed once per change of its sources' watermarks (or when a source may have turned
silent or its grace ended), not per question, and its newest time, asked per record, is kept as
it moves. A checkpoint writes the sources whose watermark moved, not all of them
(``python -m bench.event_clocks``: 181 ms of CPU per step before, 3.7 ms after; 792 kB
written per cycle before, 97 kB after).

The worker checkpoints the instant released per cluster and each source's effective watermark
(:class:`~gpulens.pipeline.checkpointing.Stateful`, one key per cluster and one per source, a cycle
writing the sources whose watermark moved); watermarks restored wait for a new barrier, since the
records they vouch for are fetched again.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpulens.pipeline.windows import from_ms

Partition = tuple[str, int]
UNBOUNDED = 2**63 - 1
"""The time of a cluster that has ended: everything may go."""
_NOTHING = -(2**63)
_NONE_STAMPED: Mapping[Partition, int] = MappingProxyType({})
DAY_MS = 86_400_000
CLOCK_SKEW_MS = 2_000
"""How far producers' clocks may disagree: a record another producer stamped this much later
than a watermark may still precede the watermark's own source's records in a partition."""
BARRIER_EVERY_S = 0.5
"""End offsets are asked for at most this often: a watermark may wait this much longer, and the
broker answers a few questions a second however many watermarks come."""


@dataclass(frozen=True, slots=True)
class EventTimeBounds:
    """How far from its cluster's time a record may lie and still be applied (module docstring)."""

    max_ahead_ms: int = DAY_MS
    """Ahead of both the wall clock and the cluster's newest time."""
    max_behind_ms: int = 7 * DAY_MS
    """Behind the cluster's released time; 0: no horizon."""

    def __post_init__(self) -> None:
        if self.max_ahead_ms <= 0 or self.max_behind_ms < 0:
            raise ValueError(
                f"event-time bounds: ahead must be positive and behind non-negative, got "
                f"{self.max_ahead_ms} and {self.max_behind_ms} ms"
            )

    def violation(
        self, at_ms: int, *, now_ms: int, newest_ms: int | None, released_ms: int | None, watermark: bool
    ) -> str | None:
        """Why a record at ``at_ms`` is out of bounds, or None. A watermark has no horizon
        behind: a source's late watermark holds nothing back that it did not already hold."""
        reference = max(now_ms, newest_ms if newest_ms is not None else now_ms)
        if at_ms > reference + self.max_ahead_ms:
            return (
                f"{_iso(at_ms)} is more than {self.max_ahead_ms / 1000:g} s ahead of "
                f"{_iso(reference)} (the wall clock or the cluster's time, whichever is later)"
            )
        horizon = None if watermark or not self.max_behind_ms or released_ms is None else released_ms
        if horizon is not None and at_ms < horizon - self.max_behind_ms:
            return (
                f"{_iso(at_ms)} is more than {self.max_behind_ms / 1000:g} s behind "
                f"{_iso(horizon)}, the cluster's released time"
            )
        return None


DEFAULT_BOUNDS = EventTimeBounds()


def _iso(at_ms: int) -> str:
    return from_ms(at_ms).isoformat()


@dataclass(slots=True)
class _Source:
    heard: float
    """Wall time of the last record or watermark."""
    first_heard: float
    """Wall time the worker first heard of it (the grace rule counts from here)."""
    effective: int | None = None
    """Its newest watermark whose barrier was met (epoch ms)."""
    final: bool = False
    """Its final watermark took effect."""
    waiting: deque[_Pending] = field(default_factory=deque)
    """Watermarks read, barrier not met yet, oldest first."""


@dataclass(slots=True)
class _Pending:
    at_ms: int
    final: bool
    produced_ms: int | None = None
    """The watermark record's own timestamp (its producer's clock), when it has one."""
    barrier: Mapping[Partition, int] | None = None
    """End offsets observed after it was read (shared by the watermarks asked about together:
    never changed); None until the worker asked the broker."""


@dataclass(slots=True)
class _Cluster:
    first_heard: float
    sources: dict[str, _Source] = field(default_factory=dict)
    released_ms: int = _NOTHING
    """Event time of the newest record handed to the operators."""
    watermarked: bool = False
    """A source of the cluster has sent a watermark (else: the partition rule applies)."""
    vouched_ms: int = _NOTHING
    """The largest effective watermark of any of its sources."""
    held: float = -math.inf
    """Wall time the worker last held input partitions back: no source is silent before it."""
    time_ms: int = _NOTHING
    """Its event time, as last computed (:meth:`EventClocks.time`)."""
    valid_until: float = -math.inf
    """Wall time at which ``time_ms`` may change by itself (a source turns silent, a grace ends)."""
    stale: bool = True
    """Something ``time_ms`` depends on changed since it was computed."""
    silent: bool = False
    """When computed, some source counted as silent (holding partitions back revives it)."""


class EventClocks:
    """Per cluster: its sources, their watermarks, and how far records may be released.

    The work per worker step does not grow with sources times partitions: watermarks asked
    about together share one barrier, each barrier is checked once per :meth:`settle`, only
    sources with watermarks waiting are visited, a cluster's time is computed once per change
    (or when a source may have turned silent), and its newest time is kept as it moves
    (``bench/event_clocks.py`` measures it with 12,500 sources).
    """

    def __init__(
        self,
        *,
        source_timeout_s: float = 10.0,
        allowed_lateness_ms: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source_timeout_s = source_timeout_s
        self.allowed_lateness_ms = allowed_lateness_ms
        self._clock = clock
        self._clusters: dict[str, _Cluster] = {}
        self._waiting: dict[tuple[str, str], tuple[_Cluster, _Source]] = {}
        """Sources with watermarks waiting for their barrier: what :meth:`settle` visits."""
        self._unasked: list[_Pending] = []
        """Watermarks without a barrier yet."""
        self._asked_at = -math.inf
        """Wall time of the last barrier (end offsets are asked for at most every BARRIER_EVERY_S)."""
        self._moved: set[tuple[str, str]] = set()
        """(cluster, source) whose checkpointed value changed since :meth:`changed` was last asked."""

    def _cluster(self, name: str) -> _Cluster:
        cluster = self._clusters.get(name)
        if cluster is None:
            cluster = self._clusters[name] = _Cluster(first_heard=self._clock())
        return cluster

    def _source(self, cluster_name: str, source: str) -> tuple[_Cluster, _Source]:
        """The source, heard now; its cluster's time is recomputed where this may change it."""
        cluster = self._cluster(cluster_name)
        now = self._clock()
        known = cluster.sources.get(source)
        if known is None:
            known = cluster.sources[source] = _Source(heard=now, first_heard=now)
            cluster.stale = True
            self._moved.add((cluster_name, source))
        elif not self._live(cluster, known, now):
            cluster.stale = True  # silent or ended until now: live again
        known.heard = now
        return cluster, known

    def hears(self, cluster: str, source: str) -> bool:
        """``source`` is live now: heard within ``source_timeout_s``, no final watermark since. A
        record of it fetched now changes nothing but how long it stays live."""
        state = self._clusters.get(cluster)
        known = None if state is None else state.sources.get(source)
        return state is not None and known is not None and self._live(state, known, self._clock())

    def _live(self, cluster: _Cluster, source: _Source, now: float) -> bool:
        """No final watermark, and heard (or its partitions held back) within ``source_timeout_s``."""
        return not source.final and now - max(source.heard, cluster.held) < self.source_timeout_s

    def heard(self, cluster: str, source: str) -> None:
        """A record of ``source`` was fetched: it is live (again, after a final watermark)."""
        known = self._source(cluster, source)[1]
        if known.final:
            known.final = False
            self._moved.add((cluster, source))

    def hold_silence(self) -> None:
        """The worker is holding input partitions back (:mod:`gpulens.pipeline.alignment`): a source
        whose records sit in them is not silent, so no source that has not ended is judged
        silent meanwhile (their last heard counts from now)."""
        now = self._clock()
        for cluster in self._clusters.values():
            cluster.held = now
            cluster.stale = cluster.stale or cluster.silent

    def watermark(
        self, cluster: str, source: str, at_ms: int, *, final: bool, produced_ms: int | None = None
    ) -> None:
        """A watermark was fetched; it waits for a barrier (:meth:`barrier`)."""
        state, known = self._source(cluster, source)
        pending = _Pending(at_ms, final, produced_ms)
        self._wait(cluster, state, source, known, pending)
        if not state.watermarked or known.effective is None:
            state.stale = True  # a first watermark waiting holds the cluster (grace rule)
        state.watermarked = True

    def _wait(
        self, name: str, cluster: _Cluster, source_name: str, source: _Source, pending: _Pending
    ) -> None:
        source.waiting.append(pending)
        self._unasked.append(pending)
        self._waiting[(name, source_name)] = (cluster, source)

    @property
    def wants_barrier(self) -> bool:
        """The last barrier is BARRIER_EVERY_S old and some watermark read has no barrier yet:
        the worker should observe end offsets."""
        return bool(self._unasked) and self._clock() - self._asked_at >= BARRIER_EVERY_S

    def asking_ends(self) -> int:
        """The worker asks the broker for end offsets now, in the background: the number of
        watermarks read so far, whose barrier its answer will be (``barrier(covers=)``)."""
        self._asked_at = self._clock()
        return len(self._unasked)

    def barrier(self, ends: Mapping[Partition, int], *, covers: int | None = None) -> None:
        """End offsets of every input partition, observed after the watermarks read so far (the
        first ``covers`` of those waiting for one, where they were asked for in the background:
        :meth:`asking_ends`): their barrier, shared, which the records stamped after each of them
        bring down (:meth:`settle`)."""
        if covers is None:
            covers = self.asking_ends()
        shared = dict(ends)
        for pending in self._unasked[:covers]:
            pending.barrier = shared
        del self._unasked[:covers]

    def settle(
        self, fetched: Mapping[Partition, int], stamped: Mapping[Partition, int] = _NONE_STAMPED
    ) -> None:
        """Apply the watermarks whose barrier the consumer has fetched up to: ``fetched``, the next
        offset per partition; ``stamped``, the latest timestamp of a record fetched per
        partition (module docstring: a partition fetched past a record stamped ``CLOCK_SKEW_MS``
        after a watermark was produced needs no more for it)."""
        vouched: dict[int, tuple[Mapping[Partition, int], int]] = {}
        done: list[tuple[str, str]] = []
        for key, (cluster, source) in self._waiting.items():
            waiting = source.waiting
            while waiting:
                head = waiting[0]
                barrier = head.barrier
                if barrier is None:
                    break
                known = vouched.get(id(barrier))  # the barrier itself is kept alive beside its verdict
                if known is None:
                    known = vouched[id(barrier)] = (barrier, _stamped_through(barrier, fetched, stamped))
                through = known[1]
                if through != UNBOUNDED and (
                    head.produced_ms is None or head.produced_ms + CLOCK_SKEW_MS > through
                ):
                    break
                pending = waiting.popleft()
                source.effective = max(
                    pending.at_ms, _NOTHING if source.effective is None else source.effective
                )
                source.final = pending.final
                cluster.vouched_ms = max(cluster.vouched_ms, source.effective)
                cluster.stale = True
                self._moved.add(key)
            if not waiting:
                done.append(key)
        for key in done:
            del self._waiting[key]

    def time(self, cluster: str) -> int | None:
        """The cluster's event time (epoch ms); None where no source of it sent a watermark."""
        state = self._clusters.get(cluster)
        if state is None or not state.watermarked:
            return None
        now = self._clock()
        if state.stale or now >= state.valid_until:
            self._compute(state, now)
        return state.time_ms

    def _compute(self, state: _Cluster, now: float) -> None:
        """The cluster's time now (module docstring), and until when it holds unless told otherwise."""
        timeout = self.source_timeout_s
        state.stale, state.silent = False, False
        if now - state.first_heard < timeout:
            state.time_ms, state.valid_until = _NOTHING, state.first_heard + timeout
            return
        until = math.inf
        slowest = UNBOUNDED
        counted = holding = False
        ended = True
        for source in state.sources.values():
            if source.final:
                continue
            ended = False
            silent_at = max(source.heard, state.held) + timeout
            if now >= silent_at:
                state.silent = True
                continue
            until = min(until, silent_at)
            if source.effective is not None:
                slowest = min(slowest, source.effective)
                counted = True
            elif source.waiting:
                holding = True  # its first watermark waits for its barrier
            elif now < source.first_heard + timeout:
                holding = True  # it may not have sent its first watermark yet
                until = min(until, source.first_heard + timeout)
            # else: heard for the timeout without any watermark: it never holds the cluster back
        state.valid_until = until
        if holding:
            state.time_ms = _NOTHING
        elif counted:
            state.time_ms = slowest
        else:
            state.time_ms = UNBOUNDED if ended else state.vouched_ms

    @property
    def starting(self) -> bool:
        """Some cluster's time stays put because the worker heard of it less than
        ``source_timeout_s`` ago (module docstring)."""
        now = self._clock()
        return any(
            c.watermarked and now - c.first_heard < self.source_timeout_s for c in self._clusters.values()
        )

    def limit(self, cluster: str) -> int | None:
        """Records of ``cluster`` with an event time below this may be released (None: no watermarks)."""
        at = self.time(cluster)
        if at is None or at in (UNBOUNDED, _NOTHING):
            return at
        return at - self.allowed_lateness_ms

    def ended(self, cluster: str) -> bool:
        """Every source of ``cluster`` has sent its final watermark and nothing holds it back."""
        return self.time(cluster) == UNBOUNDED

    def released(self, cluster: str, at_ms: int) -> None:
        """A record of ``cluster`` at ``at_ms`` went to the operators."""
        state = self._cluster(cluster)
        state.released_ms = max(state.released_ms, at_ms)

    def released_ms(self, cluster: str) -> int | None:
        """Event time of the newest record of ``cluster`` handed over (None: none yet)."""
        state = self._clusters.get(cluster)
        return None if state is None or state.released_ms == _NOTHING else state.released_ms

    def newest_ms(self, cluster: str) -> int | None:
        """The cluster's newest time: released, or vouched for by a watermark (None: neither).
        Asked per record (the bounds check): kept as it moves, never computed over the sources."""
        state = self._clusters.get(cluster)
        if state is None:
            return None
        newest = max(state.vouched_ms, state.released_ms)
        return None if newest == _NOTHING else newest

    # --- checkpoint (gpulens.pipeline.checkpointing.Stateful) -------------------------------------
    # ["cluster", name]: {"released_ms", "watermarked"}; ["source", cluster, name]: {"watermark_ms",
    # "final"}. A checkpoint of before the sources had keys of their own holds the sources in
    # the cluster's value ("sources": {name: {"watermark_ms", "final"}}): it is loaded as well.

    def changed(self) -> set[tuple[str, ...]]:
        """Every cluster (its released instant moves every cycle), and the sources new or whose
        watermark took effect since the last call: with thousands of sources a cycle rewrites
        the few that moved, not all of them."""
        keys: set[tuple[str, ...]] = {("cluster", name) for name in self._clusters}
        keys.update(("source", cluster, source) for cluster, source in self._moved)
        self._moved = set()
        return keys

    def live(self) -> Iterator[tuple[str, ...]]:
        for name, cluster in self._clusters.items():
            yield ("cluster", name)
            yield from (("source", name, source) for source in cluster.sources)

    def dump(self, key: tuple[Any, ...]) -> Any:
        """A cluster's instant released, a source's effective watermark. Watermarks still
        waiting for their barrier are left out: their offsets are not committed before the
        records they vouch for, so they are read again."""
        cluster = self._clusters.get(key[1])
        if cluster is None:
            return None
        if key[0] == "source":
            source = cluster.sources.get(key[2])
            return None if source is None else {"watermark_ms": source.effective, "final": source.final}
        return {
            "released_ms": cluster.released_ms if cluster.released_ms != _NOTHING else None,
            "watermarked": cluster.watermarked,
        }

    def load(self, key: tuple[Any, ...], saved: Any) -> None:
        """Take back a dumped cluster or source: its watermark waits for a new barrier, as if
        just read."""
        name = key[1]
        cluster = self._cluster(name)
        if key[0] == "source":
            self._load_source(name, cluster, key[2], saved)
            return
        # The checkpoint names the cluster's sources: no wait for them to speak first.
        cluster.first_heard = self._clock() - self.source_timeout_s
        cluster.watermarked = bool(saved["watermarked"])
        cluster.stale = True
        if saved["released_ms"] is not None:
            cluster.released_ms = int(saved["released_ms"])
        for source, state in saved.get("sources", {}).items():
            self._load_source(name, cluster, source, state)

    def _load_source(self, name: str, cluster: _Cluster, source: str, state: Any) -> None:
        _, restored = self._source(name, source)
        if state["watermark_ms"] is None:  # heard before the restart: its grace is over
            restored.first_heard = self._clock() - self.source_timeout_s
        else:
            pending = _Pending(int(state["watermark_ms"]), bool(state["final"]))
            self._wait(name, cluster, source, restored, pending)


def _stamped_through(
    barrier: Mapping[Partition, int], fetched: Mapping[Partition, int], stamped: Mapping[Partition, int]
) -> int:
    """The latest instant the consumer has read past in every partition short of ``barrier``
    (the oldest of their latest records' timestamps): a watermark produced ``CLOCK_SKEW_MS``
    or more before it is vouched for; UNBOUNDED where every partition reached the barrier."""
    return min(
        (stamped.get(p, _NOTHING) for p, end in barrier.items() if fetched.get(p, 0) < end),
        default=UNBOUNDED,
    )
