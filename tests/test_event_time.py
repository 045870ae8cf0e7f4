"""A cluster's event time from its sources' watermarks: barriers, liveness, the end, checkpoints."""

from __future__ import annotations

import json

import pytest

from gpulens.pipeline.event_time import (
    BARRIER_EVERY_S,
    CLOCK_SKEW_MS,
    DAY_MS,
    UNBOUNDED,
    EventClocks,
    EventTimeBounds,
)
from gpulens.testing.clocks import ManualClock

NODES, PODS = ("nodes", 0), ("pods", 0)
TIMEOUT = 10.0


def started(clock: ManualClock, *sources: str, lateness_ms: int = 0) -> EventClocks:
    """Clocks of cluster ``c`` whose ``sources`` have spoken, past the start's wait."""
    clocks = EventClocks(source_timeout_s=TIMEOUT, allowed_lateness_ms=lateness_ms, clock=clock)
    for source in sources:
        clocks.heard("c", source)
    clock.now += TIMEOUT
    for source in sources:
        clocks.heard("c", source)
    return clocks


def vouch(clocks: EventClocks, source: str, at_ms: int, *, final: bool = False) -> None:
    """A watermark read, the end offsets seen after it, and every partition fetched that far."""
    clocks.watermark("c", source, at_ms, final=final)
    clocks.barrier({NODES: 5, PODS: 7})
    clocks.settle({NODES: 5, PODS: 7})


def test_a_cluster_without_watermarks_has_no_event_time() -> None:
    clocks = started(ManualClock(), "watcher")
    assert clocks.time("c") is None
    assert clocks.limit("c") is None


def test_a_watermark_waits_until_every_partition_is_fetched_to_the_ends_seen_after_it() -> None:
    clocks = started(ManualClock(), "replay")
    clocks.watermark("c", "replay", 1_000, final=False)
    assert clocks.wants_barrier
    clocks.settle({NODES: 100, PODS: 100})
    assert clocks.limit("c") < 0, "no barrier yet: records acknowledged before it may be unfetched"
    clocks.barrier({NODES: 5, PODS: 7})
    assert not clocks.wants_barrier
    clocks.settle({NODES: 5, PODS: 6})
    assert clocks.limit("c") < 0, "pods is not fetched up to its end offset yet"
    clocks.settle({NODES: 5, PODS: 7})
    assert clocks.limit("c") == 1_000


def test_end_offsets_are_asked_for_at_most_twice_a_second_and_shared_by_the_watermarks_read() -> None:
    """Thousands of agents send a watermark every few seconds: the broker is not asked per watermark."""
    clock = ManualClock()
    clocks = started(clock, "a", "b")
    clocks.watermark("c", "a", 1_000, final=False)
    assert clocks.wants_barrier
    clocks.barrier({NODES: 5, PODS: 7})
    clocks.watermark("c", "b", 1_000, final=False)
    assert not clocks.wants_barrier, "the last barrier is younger than BARRIER_EVERY_S"
    clock.now += BARRIER_EVERY_S
    assert clocks.wants_barrier
    clocks.watermark("c", "a", 2_000, final=False)
    clocks.barrier({NODES: 9, PODS: 9})
    clocks.settle({NODES: 9, PODS: 9})
    assert clocks.time("c") == 1_000, "every watermark read before the barrier took effect by it"


def test_end_offsets_asked_in_the_background_are_the_barrier_only_of_watermarks_read_before() -> None:
    """A watermark read while the end offsets are on their way may vouch for records acknowledged
    after the broker answered: it waits for the next end offsets."""
    clock = ManualClock()
    clocks = started(clock, "a", "b")
    clocks.watermark("c", "a", 1_000, final=False)
    covers = clocks.asking_ends()
    clocks.watermark("c", "b", 1_000, final=False)
    clocks.barrier({NODES: 5, PODS: 7}, covers=covers)
    clocks.settle({NODES: 5, PODS: 7})
    assert clocks.limit("c") < 0, "b's first watermark still waits for its barrier"
    clock.now += BARRIER_EVERY_S
    assert clocks.wants_barrier
    clocks.barrier({NODES: 9, PODS: 9}, covers=clocks.asking_ends())
    clocks.settle({NODES: 9, PODS: 9})
    assert clocks.limit("c") == 1_000


def test_a_watermark_read_during_a_backlog_waits_only_for_what_was_stamped_before_it() -> None:
    """Catching up, the watermarks are read long before the data: each takes effect once every
    partition is fetched past a record stamped after it (plus the clock skew), long before the
    backlog's end."""
    clocks = started(ManualClock(), "replay")
    clocks.watermark("c", "replay", 1_000, final=False, produced_ms=50_000)
    clocks.barrier({NODES: 5_000, PODS: 9_000})  # the backlog's end
    clocks.settle({NODES: 40, PODS: 60}, {NODES: 51_900, PODS: 53_000})
    assert clocks.limit("c") < 1_000, "nodes may still hold a record its source stamped before it"
    clocks.settle({NODES: 41, PODS: 60}, {NODES: 52_000, PODS: 53_000})
    assert clocks.limit("c") == 1_000, "not the whole backlog: only what came before it"


@pytest.mark.parametrize(
    ("stamped_ms", "vouched"), [(50_000 + CLOCK_SKEW_MS - 1, False), (50_000 + CLOCK_SKEW_MS, True)]
)
def test_a_record_brings_the_barrier_down_only_past_the_clocks_skew(stamped_ms: int, vouched: bool) -> None:
    """Another producer's clock may run behind the watermark's by up to CLOCK_SKEW_MS: a record
    stamped within that of the watermark's production may still precede its source's records."""
    clocks = started(ManualClock(), "agent")
    clocks.watermark("c", "agent", 1_000, final=False, produced_ms=50_000)
    clocks.barrier({NODES: 5_000, PODS: 9_000})
    clocks.settle({NODES: 40, PODS: 60}, dict.fromkeys((NODES, PODS), stamped_ms))
    assert (clocks.limit("c") == 1_000) is vouched


def test_a_partition_fetched_to_the_end_offsets_needs_no_later_record() -> None:
    """A quiet partition (nothing stamped after the watermark) is vouched for by its end."""
    clocks = started(ManualClock(), "replay")
    clocks.watermark("c", "replay", 1_000, final=False, produced_ms=50_000)
    clocks.barrier({NODES: 5, PODS: 9_000})
    clocks.settle({NODES: 5, PODS: 60}, {NODES: 10_000, PODS: 60_000})
    assert clocks.limit("c") == 1_000


def test_a_watermark_without_a_produce_time_waits_for_the_end_offsets() -> None:
    """Without its own timestamp (a restored watermark, a topic stamped by the broker) nothing
    says which records came before it: only the end offsets seen after it do."""
    clocks = started(ManualClock(), "replay")
    clocks.watermark("c", "replay", 1_000, final=False)
    clocks.barrier({NODES: 5_000, PODS: 9_000})
    clocks.settle({NODES: 40, PODS: 60}, {NODES: 90_000, PODS: 90_000})
    assert clocks.limit("c") < 1_000
    clocks.settle({NODES: 5_000, PODS: 9_000}, {NODES: 90_000, PODS: 90_000})
    assert clocks.limit("c") == 1_000


def test_watermarks_sharing_a_barrier_take_effect_as_the_fetch_passes_each_of_them() -> None:
    """A backlog's watermarks of many seconds of produce time share one barrier (one question for
    the end offsets); each takes effect as soon as the fetch has passed its own instant."""
    clocks = started(ManualClock(), "a", "b", "c")
    for source, at_ms, produced_ms in (("a", 1_000, 50_000), ("b", 2_000, 58_000), ("c", 3_000, 53_000)):
        clocks.watermark("c", source, at_ms, final=False, produced_ms=produced_ms)
    clocks.barrier({NODES: 5_000, PODS: 9_000})
    clocks.settle({NODES: 40, PODS: 60}, {NODES: 55_500, PODS: 56_000})
    assert clocks.time("c") < 1_000, "b is not vouched for yet: the cluster waits for its first watermark"
    clocks.settle({NODES: 90, PODS: 120}, {NODES: 60_000, PODS: 60_100})
    assert clocks.time("c") == 1_000, "a, c and then b: the slowest source sets the time"


def test_a_source_s_watermarks_take_effect_in_the_order_read() -> None:
    """A later watermark vouched for first does not overtake an earlier one of the same source
    still waiting (its barrier is the end offsets alone)."""
    clock = ManualClock()
    clocks = started(clock, "replay")
    clocks.watermark("c", "replay", 1_000, final=False)
    clocks.barrier({NODES: 5_000, PODS: 9_000})
    clock.now += BARRIER_EVERY_S
    clocks.watermark("c", "replay", 2_000, final=False, produced_ms=50_000)
    clocks.barrier({NODES: 6_000, PODS: 9_500})
    clocks.settle({NODES: 40, PODS: 60}, {NODES: 60_000, PODS: 60_000})
    assert clocks.limit("c") < 1_000
    clocks.settle({NODES: 5_000, PODS: 9_000}, {NODES: 60_000, PODS: 60_000})
    assert clocks.limit("c") == 2_000


def test_the_slowest_live_source_sets_the_time_and_lateness_is_taken_off() -> None:
    clocks = started(ManualClock(), "nodes", "pods", lateness_ms=200)
    vouch(clocks, "nodes", 5_000)
    clocks.watermark("c", "pods", 3_000, final=False)
    assert clocks.limit("c") < 0, "the first watermark of pods waits for its barrier: it holds everything"
    clocks.barrier({NODES: 5, PODS: 7})
    clocks.settle({NODES: 5, PODS: 7})
    assert clocks.time("c") == 3_000
    assert clocks.limit("c") == 2_800


def test_a_source_heard_for_the_timeout_without_any_watermark_holds_nothing_back() -> None:
    """The grace rule: an agent too old to send watermarks must not stop its cluster."""
    clock = ManualClock()
    clocks = started(clock, "watcher")
    vouch(clocks, "watcher", 5_000)
    clocks.heard("c", "old-agent")
    assert clocks.limit("c") < 0, "a new source may not have sent its first watermark yet"
    clock.now += TIMEOUT - 1
    clocks.heard("c", "old-agent")
    assert clocks.limit("c") < 0, "still within its grace"
    clock.now += 1
    clocks.heard("c", "old-agent")
    assert clocks.time("c") == 5_000, "heard for the timeout and never a watermark: left out"
    clocks.watermark("c", "old-agent", 4_000, final=False)
    assert clocks.limit("c") < 0, "its first watermark, read, holds the cluster until its barrier"
    clocks.barrier({NODES: 5, PODS: 7})
    clocks.settle({NODES: 5, PODS: 7})
    assert clocks.time("c") == 4_000, "from then on it counts as any other source"


def test_a_silent_source_stops_holding_the_cluster_back_and_counts_again_when_heard() -> None:
    clock = ManualClock()
    clocks = started(clock, "nodes", "pods")
    vouch(clocks, "nodes", 5_000)
    vouch(clocks, "pods", 3_000)
    clock.now += TIMEOUT - 1
    vouch(clocks, "nodes", 6_000)
    assert clocks.time("c") == 3_000
    clock.now += 1
    assert clocks.time("c") == 6_000, "pods has been silent for the timeout"
    clocks.heard("c", "pods")
    assert clocks.time("c") == 3_000


def test_no_source_turns_silent_while_the_worker_holds_partitions_back() -> None:
    clock = ManualClock()
    clocks = started(clock, "nodes", "samples")
    vouch(clocks, "nodes", 9_000, final=True)
    vouch(clocks, "samples", 3_000)
    for _ in range(3):  # the samples' partitions paused by alignment: nothing of them fetched
        clock.now += TIMEOUT - 1
        clocks.hold_silence()
    clock.now += TIMEOUT - 1
    assert clocks.time("c") == 3_000, "the samples still hold the cluster back"
    clock.now += 1
    assert clocks.time("c") == 9_000, "once nothing is held back, silence counts again"


def test_a_new_cluster_waits_for_its_sources_to_speak() -> None:
    clock = ManualClock()
    clocks = EventClocks(source_timeout_s=TIMEOUT, clock=clock)
    clocks.heard("c", "nodes")
    vouch(clocks, "nodes", 5_000, final=True)
    assert clocks.limit("c") < 0, "another source may not have spoken yet"
    clock.now += 4
    clocks.heard("c", "pods")
    clock.now += 6
    assert clocks.limit("c") < 0, "pods is live and has sent no watermark"
    vouch(clocks, "pods", 2_000)
    assert clocks.time("c") == 2_000, "a source that sent its final watermark holds nothing back"
    assert not clocks.ended("c")


def test_the_clocks_are_starting_while_a_new_cluster_waits_for_its_sources() -> None:
    """What the worker's alignment pauses every partition on once it holds many records."""
    clock = ManualClock()
    clocks = EventClocks(source_timeout_s=TIMEOUT, clock=clock)
    clocks.heard("c", "nodes")
    assert not clocks.starting, "a cluster without watermarks has no time to wait for"
    vouch(clocks, "nodes", 5_000)
    assert clocks.starting
    clock.now += TIMEOUT
    assert not clocks.starting
    assert clocks.limit("c") == 5_000


def test_a_cluster_ends_when_every_source_sent_its_final_watermark() -> None:
    clocks = started(ManualClock(), "nodes", "pods")
    vouch(clocks, "nodes", 5_000, final=True)
    vouch(clocks, "pods", 4_000, final=True)
    assert clocks.ended("c")
    assert clocks.limit("c") == UNBOUNDED
    clocks.heard("c", "pods")
    assert not clocks.ended("c"), "a source publishing again after its end is live again"


def test_released_instants_and_watermarks_survive_a_checkpoint_and_wait_for_a_new_barrier() -> None:
    clock = ManualClock()
    clocks = started(clock, "nodes", "pods")
    vouch(clocks, "nodes", 5_000)
    vouch(clocks, "pods", 4_000, final=True)
    clocks.watermark("c", "nodes", 9_000, final=False)  # no barrier yet: read again after a restart
    clocks.released("c", 3_500)
    saved = {key: json.loads(json.dumps(clocks.dump(key))) for key in clocks.changed()}

    restored = EventClocks(source_timeout_s=TIMEOUT, clock=clock)
    for key, value in saved.items():
        restored.load(key, value)
    assert restored.released_ms("c") == 3_500
    restored.heard("c", "nodes")
    assert restored.limit("c") < 0, "restored watermarks vouch for records that are fetched again"
    assert restored.wants_barrier
    restored.barrier({NODES: 5, PODS: 7})
    restored.settle({NODES: 5, PODS: 7})
    assert restored.time("c") == 5_000, "a restored cluster knows its sources: no wait for them"
    assert {k: restored.dump(k) for k in restored.live()} == {k: clocks.dump(k) for k in clocks.live()}


def test_a_checkpoint_cycle_rewrites_only_the_sources_whose_watermark_moved() -> None:
    """With an agent per node a cluster has thousands of sources: a cycle writes the few that
    moved, not every one of them."""
    clocks = started(ManualClock(), *(f"agent/{i}" for i in range(100)))
    for i in range(100):
        vouch(clocks, f"agent/{i}", 1_000)
    assert len(clocks.changed()) == 1 + 100, "the first checkpoint: the cluster and every source"
    vouch(clocks, "agent/7", 2_000)
    clocks.heard("c", "agent/8")
    clocks.watermark("c", "agent/9", 3_000, final=False)  # waiting: nothing to write yet
    assert clocks.changed() == {("cluster", "c"), ("source", "c", "agent/7")}
    assert clocks.dump(("source", "c", "agent/7")) == {"watermark_ms": 2_000, "final": False}
    assert clocks.dump(("source", "c", "unknown")) is None


def test_a_checkpoint_holding_the_sources_in_the_clusters_value_is_loaded_as_well() -> None:
    """The layout before sources had keys of their own."""
    clock = ManualClock()
    restored = EventClocks(source_timeout_s=TIMEOUT, clock=clock)
    restored.load(
        ("cluster", "c"),
        {
            "released_ms": 3_500,
            "watermarked": True,
            "sources": {
                "nodes": {"watermark_ms": 5_000, "final": False},
                "new": {"watermark_ms": None, "final": False},
            },
        },
    )
    restored.barrier({NODES: 5, PODS: 7})
    restored.settle({NODES: 5, PODS: 7})
    assert restored.released_ms("c") == 3_500
    assert restored.time("c") == 5_000, (
        "a source without watermarks before the restart holds nothing back after it"
    )
    assert set(restored.live()) == {("cluster", "c"), ("source", "c", "nodes"), ("source", "c", "new")}


def test_bounds_ahead_count_from_the_later_of_the_wall_clock_and_the_clusters_time() -> None:
    bounds = EventTimeBounds(max_ahead_ms=DAY_MS, max_behind_ms=7 * DAY_MS)
    now = 1_795_000_000_000  # 2026-11
    replayed = 1_500_000_000_000  # 2017: a replayed trace, far behind the wall clock

    def why(at_ms: int, **known: int | None) -> str | None:
        return bounds.violation(
            at_ms,
            now_ms=now,
            newest_ms=known.get("newest"),
            released_ms=known.get("released"),
            watermark=False,
        )

    assert why(replayed) is None
    assert why(now + DAY_MS) is None
    assert "ahead" in (why(now + DAY_MS + 1) or "")
    assert why(now + 3 * DAY_MS, newest=now + 2 * DAY_MS + 1) is None, "a cluster whose clock runs ahead"


def test_bounds_behind_count_from_the_released_time_and_spare_watermarks() -> None:
    bounds = EventTimeBounds(max_ahead_ms=DAY_MS, max_behind_ms=7 * DAY_MS)
    released = 1_500_000_000_000
    old = released - 7 * DAY_MS - 1
    assert (
        bounds.violation(
            released - 7 * DAY_MS, now_ms=released, newest_ms=None, released_ms=released, watermark=False
        )
        is None
    )
    assert "behind" in (
        bounds.violation(old, now_ms=released, newest_ms=None, released_ms=released, watermark=False) or ""
    )
    assert (
        bounds.violation(old, now_ms=released, newest_ms=None, released_ms=released, watermark=True) is None
    )
    assert bounds.violation(old, now_ms=released, newest_ms=None, released_ms=None, watermark=False) is None
    no_horizon = EventTimeBounds(max_behind_ms=0)
    assert (
        no_horizon.violation(old, now_ms=released, newest_ms=None, released_ms=released, watermark=False)
        is None
    )


def test_bounds_refuse_a_non_positive_ahead_or_a_negative_behind() -> None:
    for ahead, behind in ((0, 0), (DAY_MS, -1)):
        with pytest.raises(ValueError, match="event-time bounds"):
            EventTimeBounds(max_ahead_ms=ahead, max_behind_ms=behind)


def test_the_newest_time_of_a_cluster_is_its_released_or_vouched_time() -> None:
    clock = ManualClock()
    clocks = started(clock, "replay")
    assert clocks.newest_ms("c") is None
    vouch(clocks, "replay", 5_000)
    assert clocks.newest_ms("c") == 5_000
    clocks.released("c", 7_000)
    assert clocks.newest_ms("c") == 7_000
    assert clocks.newest_ms("unknown") is None
