"""GPU names to device ids per sample batch, as the worker's operators resolve them: CPU per batch.

    python -m bench.name_lookups [--nodes 12500] [--gpus-per-node 8] [--rounds 8] [--inventory-every 300]

One cluster's :class:`~gpulens.pipeline.device_names.DeviceNames` learns ``--nodes``
inventories, their GPUs the fleet simulator's (named by UUID, which is their device_id, PCI
address and serial), then resolves ``--rounds`` batches of every node, in a shuffled order,
each naming its GPUs by device_id as the samples do, with one list per node (the columnar
reader's shared list), and one node's inventory learned again every ``--inventory-every``
batches (an agent sends its own every 600 s, a batch every 2 s: 300 batches; its PCI addresses,
the same on every node, move to its GPUs each time). Prints the CPU per batch (the inventories
included) of a map over the GPUs (the baseline: one probe of the names map per GPU) and of the
answer kept per node, each twice, alternating. Never asserts.
"""

from __future__ import annotations

import argparse
import random
import time
from datetime import UTC, datetime

from gpulens.pipeline.device_names import DeviceNames
from gpulens.producers.simulate import SimulationSpec
from gpulens.producers.simulate.records import gpu_devices
from gpulens.schemas.model.models import DeviceInventory

AT = datetime(2026, 1, 1, tzinfo=UTC)


def learned(nodes: int, gpus_per_node: int) -> tuple[DeviceNames, list[tuple[DeviceInventory, list[str]]]]:
    """The names map of the fleet, and each node's inventory with its batches' device_ids."""
    model = SimulationSpec(nodes=nodes, gpus_per_node=gpus_per_node, interval_s=2.0, start=AT).model
    names, batches = DeviceNames(), []
    for n in range(nodes):
        node = f"node-{n:05d}"
        gpus = gpu_devices("c", node, model, gpus_per_node)
        inventory = DeviceInventory(
            event_id=node, cluster="c", source="b", event_time=AT, node=node, gpus=gpus
        )
        names.learn(inventory)
        batches.append((inventory, [gpu.device_id for gpu in gpus]))
    return names, batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=12_500, help="Nodes (12,500: 100,000 GPUs).")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=8, help="Batches of every node resolved per pass.")
    parser.add_argument("--inventory-every", type=int, default=300, help="Batches per inventory (0: none).")
    args = parser.parse_args()
    names, batches = learned(args.nodes, args.gpus_per_node)
    order = batches * args.rounds
    random.Random(1).shuffle(order)
    every = args.inventory_every or len(order) + 1
    print(f"{args.nodes:,} nodes x {args.gpus_per_node} GPUs, {len(order):,} batches a pass")
    for label, per_node in (("baseline: map per GPU", False), ("kept per node", True)) * 2:
        started = time.process_time()
        for i, (inventory, device_ids) in enumerate(order):
            if i % every == every - 1:
                names.learn(inventory)
            names.device_ids(device_ids, inventory.node if per_node else None)
        spent = time.process_time() - started
        print(f"  {label:<22} {spent / len(order) * 1e6:6.2f} us CPU a batch")


if __name__ == "__main__":
    main()
