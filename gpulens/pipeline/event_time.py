"""Each cluster's event time, from the watermarks its sources publish.

A source (a watcher, an agent, the gateway, a replay) publishes ``Watermark(cluster, source,
event_time=T)`` after the broker acknowledged every record of its with an event time below
``T``. How far the worker may process a cluster is then a fact the sources state, not a guess
from partitions that look empty (two runs of one replay gave different alerts that way).

Rules, per cluster:

- A watermark read is not trusted at once: records acknowledged before it was produced may
  sit in partitions the consumer has not fetched that far. It takes effect once every input
  partition has been fetched up to its *barrier*: the end offsets observed right after it was
  read, lowered, where the broker can tell, to the first offset stamped ``CLOCK_SKEW_MS`` after
  the watermark itself was produced (its source stamped its earlier records before it). So a
  worker catching up on a backlog releases as it reads, instead of holding everything read
  until the backlog's end: memory follows the skew allowance, not the backlog.
- A source is *live* from the first record or watermark heard from it until it sends a final
  watermark or stays silent for ``source_timeout_s`` of wall time. A live source that has not
  sent a watermark yet holds the cluster back entirely.
- The cluster's event time is the smallest effective watermark of its live sources. With no
  live source: unbounded once every source it knows has sent its final watermark (the cluster
  has *ended*), else the largest effective watermark any source gave.
- A source the worker has not heard of yet cannot hold anything back, so a cluster's time
  stays put for ``source_timeout_s`` after the worker first hears of it: every source that
  exists has spoken by then, or counts as silent. A cluster restored from a checkpoint knows
  its sources already and does not wait.
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

The worker checkpoints the sources' watermarks and the instant released per cluster
(:class:`~gpulens.pipeline.checkpointing.Stateful`, one key per cluster); watermarks restored wait for a new
barrier, since the records they vouch for are fetched again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpulens.pipeline.windows import from_ms

Partition = tuple[str, int]
UNBOUNDED = 2**63 - 1
"""The time of a cluster that has ended: everything may go."""
_NOTHING = -(2**63)
DAY_MS = 86_400_000
CLOCK_SKEW_MS = 2_000
"""How far producers' clocks may disagree: a record another producer stamped this much later
than a watermark may still precede the watermark's own source's records in a partition."""


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
    effective: int | None = None
    """Its newest watermark whose barrier was met (epoch ms)."""
    final: bool = False
    """Its final watermark took effect."""
    waiting: list[_Pending] = field(default_factory=list)
    """Watermarks read, barrier not met yet, oldest first."""


@dataclass(slots=True)
class _Pending:
    at_ms: int
    final: bool
    produced_ms: int | None = None
    """The watermark record's own timestamp (its producer's clock), when it has one."""
    barrier: dict[Partition, int] | None = None
    """End offsets observed after it was read; None until the worker asked the broker."""


@dataclass(slots=True)
class _Cluster:
    first_heard: float
    sources: dict[str, _Source] = field(default_factory=dict)
    released_ms: int = _NOTHING
    """Event time of the newest record handed to the operators."""
    watermarked: bool = False
    """A source of the cluster has sent a watermark (else: the partition rule applies)."""


class EventClocks:
    """Per cluster: its sources, their watermarks, and how far records may be released."""

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

    def _cluster(self, name: str) -> _Cluster:
        cluster = self._clusters.get(name)
        if cluster is None:
            cluster = self._clusters[name] = _Cluster(first_heard=self._clock())
        return cluster

    def _source(self, cluster: str, source: str) -> _Source:
        sources = self._cluster(cluster).sources
        known = sources.get(source)
        if known is None:
            known = sources[source] = _Source(heard=self._clock())
        known.heard = self._clock()
        return known

    def heard(self, cluster: str, source: str) -> None:
        """A record of ``source`` was fetched: it is live (again, after a final watermark)."""
        self._source(cluster, source).final = False

    def hold_silence(self) -> None:
        """The worker is holding input partitions back (:mod:`gpulens.pipeline.alignment`): a source
        whose records sit in them is not silent, so no source that has not ended is judged
        silent meanwhile (their last heard moves to now)."""
        now = self._clock()
        for cluster in self._clusters.values():
            for source in cluster.sources.values():
                if not source.final:
                    source.heard = now

    def watermark(
        self, cluster: str, source: str, at_ms: int, *, final: bool, produced_ms: int | None = None
    ) -> None:
        """A watermark was fetched; it waits for a barrier (:meth:`barrier`)."""
        self._source(cluster, source).waiting.append(_Pending(at_ms, final, produced_ms))
        self._cluster(cluster).watermarked = True

    @property
    def wants_barrier(self) -> bool:
        """Some watermark read has no barrier yet: the worker should observe end offsets."""
        return any(
            p.barrier is None for c in self._clusters.values() for s in c.sources.values() for p in s.waiting
        )

    def barrier(
        self,
        ends: Mapping[Partition, int],
        stamped_from: Callable[[int], Mapping[Partition, int]] | None = None,
    ) -> None:
        """End offsets of every input partition, observed after the watermarks read so far;
        ``stamped_from(ms)``: per partition, the first offset stamped at ``ms`` or later (absent
        where the broker cannot tell)."""
        asked: dict[int, Mapping[Partition, int]] = {}
        for cluster in self._clusters.values():
            for source in cluster.sources.values():
                for pending in source.waiting:
                    if pending.barrier is not None:
                        continue
                    pending.barrier = dict(ends)
                    if stamped_from is None or pending.produced_ms is None:
                        continue
                    # one question per second of produce time: a later bound is only safer
                    second = (pending.produced_ms + CLOCK_SKEW_MS) // 1000 * 1000 + 1000
                    if second not in asked:
                        asked[second] = stamped_from(second)
                    for partition, offset in asked[second].items():
                        if partition in pending.barrier:
                            pending.barrier[partition] = min(pending.barrier[partition], offset)

    def settle(self, fetched: Mapping[Partition, int]) -> None:
        """Apply the watermarks whose barrier the consumer has fetched up to (next offsets)."""
        for cluster in self._clusters.values():
            for source in cluster.sources.values():
                while source.waiting and _met(source.waiting[0].barrier, fetched):
                    pending = source.waiting.pop(0)
                    source.effective = max(pending.at_ms, source.effective or _NOTHING)
                    source.final = pending.final

    def time(self, cluster: str) -> int | None:
        """The cluster's event time (epoch ms); None where no source of it sent a watermark."""
        state = self._clusters.get(cluster)
        if state is None or not state.watermarked:
            return None
        now = self._clock()
        if now - state.first_heard < self.source_timeout_s:
            return _NOTHING
        live = [s for s in state.sources.values() if not s.final and now - s.heard < self.source_timeout_s]
        if live:
            return min(_NOTHING if s.effective is None else s.effective for s in live)
        if all(s.final for s in state.sources.values()):
            return UNBOUNDED
        return max((s.effective for s in state.sources.values() if s.effective is not None), default=_NOTHING)

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
        """The cluster's newest time: released, or vouched for by a watermark (None: neither)."""
        state = self._clusters.get(cluster)
        if state is None:
            return None
        vouched = [s.effective for s in state.sources.values() if s.effective is not None]
        newest = max([*vouched, state.released_ms])
        return None if newest == _NOTHING else newest

    # --- checkpoint (gpulens.pipeline.checkpointing.Stateful): ["cluster", name] per cluster ----------

    def changed(self) -> set[tuple[str, str]]:
        """Every cluster: a few small values each, rewritten every cycle."""
        return {("cluster", name) for name in self._clusters}

    def live(self) -> Iterator[tuple[str, str]]:
        return (("cluster", name) for name in self._clusters)

    def dump(self, key: tuple[Any, ...]) -> Any:
        """Effective watermarks and the instant released. Watermarks still waiting for their
        barrier are left out: their offsets are not committed before the records they vouch
        for, so they are read again."""
        cluster = self._clusters.get(key[1])
        if cluster is None:
            return None
        return {
            "released_ms": cluster.released_ms if cluster.released_ms != _NOTHING else None,
            "watermarked": cluster.watermarked,
            "sources": {
                source: {"watermark_ms": state.effective, "final": state.final}
                for source, state in cluster.sources.items()
            },
        }

    def load(self, key: tuple[Any, ...], saved: Any) -> None:
        """Take back a dumped cluster: its watermarks wait for a new barrier, as if just read."""
        name = key[1]
        cluster = self._cluster(name)
        # The checkpoint names the cluster's sources: no wait for them to speak first.
        cluster.first_heard = self._clock() - self.source_timeout_s
        cluster.watermarked = bool(saved["watermarked"])
        if saved["released_ms"] is not None:
            cluster.released_ms = int(saved["released_ms"])
        for source, state in saved["sources"].items():
            restored = self._source(name, source)
            if state["watermark_ms"] is not None:
                restored.waiting.append(_Pending(int(state["watermark_ms"]), bool(state["final"])))


def _met(barrier: dict[Partition, int] | None, fetched: Mapping[Partition, int]) -> bool:
    return barrier is not None and all(fetched.get(p, 0) >= end for p, end in barrier.items())
