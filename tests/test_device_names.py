"""GPU names resolve to device ids, and are checkpointed per node: a restore in any order gives
the same map, and an older checkpoint's per-name entries are read and replaced."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest
from test_checkpointed_state import OPERATORS

from gpulens.pipeline.device_names import UNPLACED, DeviceNames
from gpulens.producers.simulate import ClusterSimulation, SimulationSpec
from gpulens.schemas.model.models import DeviceInventory, GpuDevice

AT = datetime(2025, 1, 1, tzinfo=UTC)


def gpu(device_id: str, uuid: str | None = None, bdf: str | None = None) -> GpuDevice:
    return GpuDevice(device_id=device_id, index=0, vendor="AMD", model="MI300X", uuid=uuid, bdf=bdf)


def inventory(node: str, *gpus: GpuDevice) -> DeviceInventory:
    return DeviceInventory(
        event_id=f"i-{node}", cluster="c", event_time=AT, source="t", node=node, gpus=list(gpus)
    )


def restored(names: DeviceNames, order: list[str]) -> DeviceNames:
    """A fresh map loaded from ``names``' entries, nodes taken in ``order``."""
    fresh = DeviceNames()
    for node in order:
        entry = names.dump(node)
        if entry is not None:
            fresh.load(node, entry)
    return fresh


@pytest.fixture(scope="module")
def fleet_inventories() -> list[DeviceInventory]:
    """Every inventory a 500-node cluster (4,000 GPUs) sends at its start."""
    spec = SimulationSpec(nodes=500, gpus_per_node=8, interval_s=2.0, start=AT, duration_s=2, cluster="c")
    return [event for _, event in ClusterSimulation(spec).events() if isinstance(event, DeviceInventory)]


def test_a_name_an_inventory_lists_resolves_to_its_device_and_others_to_themselves() -> None:
    names = DeviceNames()
    names.learn(inventory("n1", gpu("d1", uuid="GPU-1", bdf="0000:0c:00.0")))
    assert names.device_ids(["GPU-1", "0000:0c:00.0", "d1", "GPU-9"]) == ["d1", "d1", "d1", "GPU-9"]


def test_a_fleets_names_are_one_entry_per_node_and_restore_in_any_order(
    fleet_inventories: list[DeviceInventory],
) -> None:
    names = DeviceNames()
    for event in fleet_inventories:
        names.learn(event)
    listed = {alias: d.device_id for event in fleet_inventories for d in event.gpus for alias in d.aliases}
    # UUIDs and serials; PCI addresses repeat across nodes: each moves to the last node listing it
    assert len(listed) >= 2 * 4_000
    changed = names.take_changed()
    assert changed == {event.node for event in fleet_inventories} and names.take_changed() == set()
    nodes = sorted(changed)
    for order in (nodes, nodes[::-1], random.Random(7).sample(nodes, len(nodes))):
        back = restored(names, order)
        assert back.device_ids(list(listed)) == list(listed.values())


def test_a_name_that_moves_to_another_nodes_gpu_leaves_its_former_nodes_entry() -> None:
    names = DeviceNames()
    names.learn(inventory("a", gpu("d1", uuid="GPU-X")))
    names.learn(inventory("b", gpu("d2", uuid="GPU-Y")))
    names.take_changed()
    names.learn(inventory("b", gpu("d2", uuid="GPU-X")))  # the UUID now names b's GPU
    assert names.take_changed() == {"a", "b"}, "both entries are written again"
    assert names.dump("a") == {}
    for order in (["a", "b"], ["b", "a"]):
        assert restored(names, order).device_ids(["GPU-X", "GPU-Y"]) == ["d2", "d2"]


def test_an_older_checkpoints_per_name_entry_still_resolves() -> None:
    names = DeviceNames()
    names.load_name("GPU-1", "d1")
    assert names.device_id("GPU-1") == "d1"
    assert names.take_changed() == {UNPLACED}
    assert restored(names, [UNPLACED]).device_id("GPU-1") == "d1"


@pytest.mark.parametrize(
    ("name", "older", "newer"),
    [
        ("workloads", ("holders", "c", "alias", "GPU-1"), ("holders", "c", "names", UNPLACED)),
        ("alerts", ("holders", "c", "alias", "GPU-1"), ("holders", "c", "names", UNPLACED)),
        ("idle", ("alias", "c", "GPU-1"), ("names", "c", UNPLACED)),
    ],
)
def test_an_operators_next_checkpoint_replaces_an_older_per_name_entry(
    name: str, older: tuple[str, ...], newer: tuple[str, ...]
) -> None:
    state = OPERATORS[name]().state
    state.load(older, "d1")
    written = {key: state.dump(key) for key in state.changed()}
    assert written[older] is None, "the per-name entry is deleted"
    assert written[newer] == {"d1": ["GPU-1"]}


def test_a_name_that_comes_back_to_its_own_device_resolves_to_it_after_a_restore() -> None:
    names = DeviceNames()
    names.learn(inventory("b", gpu("d2", uuid="d1")))  # d1 first names b's GPU
    names.learn(inventory("a", gpu("d1", uuid="d1")))  # then its own device, on a
    assert names.take_changed() == {"a", "b"}
    for order in (["a", "b"], ["b", "a"]):
        assert restored(names, order).device_ids(["d1", "d2"]) == ["d1", "d2"]


def test_a_nodes_batch_giving_the_same_names_again_resolves_as_the_names_map_says_now() -> None:
    names = DeviceNames()
    names.learn(inventory("n1", gpu("d1", uuid="GPU-1"), gpu("d2", uuid="GPU-2")))
    batch = ["GPU-1", "GPU-2"]  # the one list the columnar reader gives every batch of n1
    assert names.device_ids(batch, "n1") == ["d1", "d2"]
    assert names.device_ids(batch, "n1") == ["d1", "d2"]
    names.learn(inventory("n2", gpu("d9", uuid="GPU-2")))  # GPU-2 now names n2's GPU
    assert names.device_ids(batch, "n1") == ["d1", "d9"], "a name that moved resolves anew"
    names.learn(inventory("n1", gpu("d1", uuid="GPU-1"), gpu("d2", uuid="GPU-2")))
    assert names.device_ids(batch, "n1") == ["d1", "d2"], "and back"


def test_an_answer_is_kept_while_names_outside_it_move() -> None:
    """PCI addresses repeat on every node, and each node's inventory moves them to its GPUs:
    a batch naming its GPUs by device_id keeps its answer."""
    names = DeviceNames()
    names.learn(inventory("n1", gpu("d1", uuid="GPU-1", bdf="0000:19:00.0")))
    batch = ["GPU-1"]
    kept = names.device_ids(batch, "n1")
    names.learn(inventory("n2", gpu("d2", bdf="0000:19:00.0")))
    assert names.device_id("0000:19:00.0") == "d2"
    assert names.device_ids(batch, "n1") is kept == ["d1"]


def test_a_device_id_that_comes_to_name_another_gpu_resolves_anew() -> None:
    names = DeviceNames()
    names.learn(inventory("n1", gpu("d1")))
    batch = ["d1"]
    assert names.device_ids(batch, "n1") == ["d1"]
    names.learn(inventory("n2", gpu("d2", uuid="d1")))  # another GPU's inventory lists "d1" as its UUID
    assert names.device_ids(batch, "n1") == ["d2"]


def test_the_answers_kept_are_bounded_whatever_nodes_the_records_name() -> None:
    names = DeviceNames()
    names.learn(inventory("n0", gpu("d0", uuid="GPU-0")))
    first = ["GPU-0"]
    kept = names.device_ids(first, "n0")
    assert names.device_ids(first, "n0") is kept
    for i in range(1, 100_001):
        names.device_ids([f"d{i}"], f"n{i}")
    again = names.device_ids(first, "n0")
    assert again == kept == ["d0"] and again is not kept, "forgotten, and resolved anew"


def test_another_list_of_a_node_or_a_restore_resolves_anew() -> None:
    names = DeviceNames()
    names.learn(inventory("n1", gpu("d1", uuid="GPU-1")))
    assert names.device_ids(["GPU-1"], "n1") == ["d1"]
    assert names.device_ids(["d1", "GPU-7"], "n1") == ["d1", "GPU-7"], "not the list kept for n1"
    kept = ["GPU-7"]
    assert names.device_ids(kept, "n1") == ["GPU-7"]
    names.load("n3", {"d7": ["GPU-7"]})  # a restore's entry names GPU-7
    assert names.device_ids(kept, "n1") == ["d7"]
    names.load_name("GPU-8", "d8")
    assert names.device_ids(["GPU-8"], "n1") == ["d8"]


def test_an_entry_loaded_again_adds_no_name(fleet_inventories: list[DeviceInventory]) -> None:
    names = DeviceNames()
    for event in fleet_inventories:
        names.learn(event)
    nodes = list(names.nodes())
    twice = restored(names, nodes)
    for node in nodes:  # operators sharing the map each restore their own checkpoint into it
        twice.load(node, names.dump(node) or {})
    assert [twice.dump(node) for node in nodes] == [names.dump(node) for node in nodes]
