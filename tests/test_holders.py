"""GPU holders checkpointed per container: whatever containers claim, release and take from each
other, a restore from the checkpoints (in any order) holds the GPUs as the live state does, and
an older checkpoint's per-GPU entries are read and replaced."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any

import pytest

from gpulens.pipeline.holders import GpuHolders, PodRef, SharedHolders
from gpulens.schemas.model.models import ChangeType, ContainerEvent, DeviceAssignment, DeviceKind

AT = datetime(2025, 1, 1, tzinfo=UTC)
GPUS = [f"GPU-{n}" for n in range(6)]
Log = dict[tuple[str, ...], Any]


def container(pod: str, name: str, gpus: list[str], *, deleted: bool = False) -> ContainerEvent:
    return ContainerEvent(
        event_id=f"{pod}-{name}-{'-'.join(gpus)}", cluster="c", event_time=AT, source="t",
        type=ChangeType.DELETED if deleted else ChangeType.MODIFIED, node="n1", pod_uid=f"uid-{pod}",
        pod_namespace="ns", pod_name=pod, container_name=name,
        devices=[DeviceAssignment(resource_name="amd/gpu", device_id=g, kind=DeviceKind.GPU) for g in gpus],
    )  # fmt: skip


def checkpoint(holders: GpuHolders, log: Log, reader: int = 0) -> None:
    """Write what changed (for ``reader``) into ``log`` as a compacted topic keeps it (a
    deleted key is gone)."""
    for key in holders.take_changed("c", reader):
        value = holders.dump(key[2:])
        if value is None:
            log.pop(key, None)
        else:
            log[key] = value


def restored(log: Log, order: list[tuple[str, ...]]) -> GpuHolders:
    holders = GpuHolders()
    for key in order:
        holders.load(key[2:], log[key])
    return holders


def held(holders: GpuHolders) -> list[PodRef | None]:
    return holders.holders(GPUS)


def random_claims(seed: int, steps: int) -> list[ContainerEvent]:
    """Containers of three pods claiming random GPUs, often the same ones, and going away."""
    rng = random.Random(seed)
    return [
        container(
            rng.choice(["p1", "p2", "p3"]),
            rng.choice(["a", "b"]),
            rng.sample(GPUS, rng.randint(0, 3)),
            deleted=rng.random() < 0.2,
        )
        for _ in range(steps)
    ]


@pytest.mark.parametrize("seed", range(20))
def test_a_restore_in_any_order_holds_the_gpus_as_the_live_state_does(seed: int) -> None:
    live, log, rng = GpuHolders(), Log(), random.Random(seed)
    for step, event in enumerate(random_claims(seed, 60)):
        live.container(event)
        if step % 3 == 0 or step == 59:
            checkpoint(live, log)
            keys = list(log)
            for order in (keys, keys[::-1], rng.sample(keys, len(keys))):
                assert held(restored(log, order)) == held(live), f"after event {step}: {event.event_id}"


def test_a_gpu_another_container_takes_is_written_again_without_it() -> None:
    holders, log = GpuHolders(), Log()
    holders.container(container("p1", "a", ["GPU-0", "GPU-1"]))
    checkpoint(holders, log)
    holders.container(container("p2", "a", ["GPU-1"]))
    checkpoint(holders, log)
    assert log[("holders", "c", "container", "n1", "ns", "p1", "a")] == {
        "uid": "uid-p1", "gpus": ["GPU-0", "GPU-1"], "held": ["GPU-0"],
    }  # fmt: skip
    assert log[("holders", "c", "container", "n1", "ns", "p2", "a")] == {"uid": "uid-p2", "gpus": ["GPU-1"]}


def test_an_older_checkpoints_per_gpu_entries_are_read_and_replaced_by_the_next() -> None:
    live = GpuHolders()
    for event in random_claims(3, 40):
        live.container(event)
    older: Log = {}  # as the code before this layout wrote it
    for (node, namespace, pod, name), gpus in live._containers.items():
        older[("holders", "c", "container", node, namespace, pod, name)] = sorted(gpus)
    for gpu, holder in live._holders.items():
        older[("holders", "c", "gpu", gpu)] = [holder.uid, holder.namespace, holder.name]
    assert any(key[2] == "gpu" for key in older), "some GPUs are held"
    upgraded = restored(older, list(older))
    assert held(upgraded) == held(live)
    log = dict(older)
    checkpoint(upgraded, log)
    assert {key[2] for key in log} == {"container"}, "per-GPU entries deleted, containers rewritten"
    assert held(restored(log, list(log)[::-1])) == held(live)


def test_operators_sharing_one_table_each_checkpoint_every_change() -> None:
    shared = SharedHolders()
    readers = [shared.add_reader(), shared.add_reader()]
    table, logs = shared.of("c"), [Log(), Log()]
    for step, event in enumerate(random_claims(5, 60)):
        for _ in readers:  # each sharing operator applies the event it is given
            table.container(event)
        if step % 4 == 0 or step == 59:
            for reader, log in zip(readers, logs, strict=True):
                checkpoint(table, log, reader)
    assert logs[0] == logs[1], "each operator's checkpoint holds the whole table"
    assert held(restored(logs[1], list(logs[1]))) == held(table)


def test_an_event_applied_again_by_another_sharing_operator_changes_nothing() -> None:
    once, twice = GpuHolders(), GpuHolders()
    for event in random_claims(11, 80):
        once.container(event)
        twice.container(event)
        twice.container(event)
        assert held(twice) == held(once), event.event_id
    keys = sorted(once.live())
    assert sorted(twice.live()) == keys and [twice.dump(k) for k in keys] == [once.dump(k) for k in keys]


def test_both_sharing_operators_checkpoints_restored_into_one_table_hold_as_the_live_one() -> None:
    live, log = GpuHolders(), Log()
    for event in random_claims(7, 50):
        live.container(event)
    checkpoint(live, log)
    shared = SharedHolders()
    for _ in range(2):
        shared.add_reader()
    table = shared.of("c")
    for _ in range(2):  # each operator's state log gives the same entries
        for key, value in log.items():
            table.load(key[2:], value)
    assert held(table) == held(live)
    assert [table.dump(key[2:]) for key in log] == list(log.values())


def test_an_operator_joining_shared_holders_after_a_table_was_made_is_refused() -> None:
    shared = SharedHolders()
    shared.add_reader()
    shared.of("c")
    with pytest.raises(RuntimeError, match="after their first table"):
        shared.add_reader()
