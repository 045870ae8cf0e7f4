"""The event-time merge of input partitions: order, waiting for slow partitions, idleness."""

from __future__ import annotations

from gpulens.pipeline.merging import EventTimeMerge, PartitionEnds, Stamped
from gpulens.testing.clocks import ManualClock

A, B = ("pods", 0), ("pods", 1)


def item(partition: tuple[str, int], offset: int, at: int) -> Stamped[str]:
    return Stamped(at, 0, partition[1], offset, partition[0], f"{partition[1]}@{offset}")


def test_records_are_released_in_event_time_order_across_partitions() -> None:
    ends = PartitionEnds([A, B])
    merge: EventTimeMerge[str] = EventTimeMerge(ends, idle_ms=1000)
    for offset, at in enumerate([10, 30, 50]):
        merge.add(item(A, offset, at))
    for offset, at in enumerate([20, 40]):
        merge.add(item(B, offset, at))
    # B's buffer runs dry after 40: A's 50 must wait, B may still deliver something earlier.
    assert [i.record for i in merge.release()] == ["0@0", "1@0", "0@1", "1@1"]
    assert merge.buffered == 1


def test_a_quiet_partition_holds_the_others_back_until_idle_and_drained() -> None:
    clock = ManualClock()
    drained = {A: True, B: False}
    ends = PartitionEnds([A, B], drained=lambda p: drained[p], clock=clock)
    merge: EventTimeMerge[str] = EventTimeMerge(ends, idle_ms=1000)
    merge.add(item(A, 0, 10))
    assert merge.release() == []  # B has said nothing yet
    ends.reached(B)
    assert merge.release() == []  # B is at its end, but only just
    clock.now = 5.0
    assert merge.release() == []  # long enough, but the broker still holds records of B
    drained[B] = True
    assert [i.record for i in merge.release()] == ["0@0"]


def test_new_data_on_a_partition_ends_its_idleness() -> None:
    clock = ManualClock()
    ends = PartitionEnds([A, B], clock=clock)
    merge: EventTimeMerge[str] = EventTimeMerge(ends, idle_ms=1000)
    ends.reached(B)
    clock.now = 5.0
    merge.add(item(B, 0, 100))
    merge.release()  # B's record goes only once A has spoken
    assert merge.buffered == 1
    merge.add(item(A, 0, 50))
    assert [i.record for i in merge.release()] == ["0@0"]
    assert merge.buffered == 1


def test_with_a_bound_from_watermarks_records_go_below_it_whatever_the_partitions_say() -> None:
    ends = PartitionEnds([A, B], drained=lambda _p: False)
    merge: EventTimeMerge[str] = EventTimeMerge(ends, idle_ms=1000)
    for offset, at in enumerate([30, 10]):  # two sources in one partition: not in time order
        merge.add(item(A, offset, at))
    merge.add(item(B, 0, 20))
    assert [i.record for i in merge.release(below_ms=25)] == ["0@1", "1@0"]
    assert [i.record for i in merge.release(below_ms=31)] == ["0@0"]
    assert merge.buffered == 0
