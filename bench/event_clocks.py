"""The worker's event clocks with one source per node agent: CPU per worker step.

    python -m bench.event_clocks [--sources 12500] [--partitions 26] [--steps 200]

One cluster of ``--sources`` live sources (an agent per node: 12,500 at 100,000 GPUs), each
heard every 5 s (its sample batch) and sending a watermark every 10 s, read by a worker that
steps every 0.2 s (simulated time, driven by the bench: no sleeping) over ``--partitions``
input partitions. Each step does what ``StreamWorker.step`` does with the clocks: per record
read the bounds check (``newest_ms``) and ``heard``, per watermark read ``watermark``, then
``barrier`` when wanted, ``settle``, ``limit`` and ``ended``; every 1 s (a worker cycle) the
checkpoint's changed keys are dumped as the state log writes them (JSON). Prints the CPU per
step of the clocks alone and its parts, and the bytes a cycle writes. Never asserts.
"""

from __future__ import annotations

import argparse
import json
import time

from gpulens.pipeline.event_time import EventClocks
from gpulens.testing.clocks import ManualClock

STEP_S = 0.2
CYCLE_STEPS = 5
"""Steps per worker cycle (1 s: one transaction, one checkpoint)."""
HEARD_EVERY_S = 5.0
WATERMARK_EVERY_S = 10.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", type=int, default=12_500)
    parser.add_argument("--partitions", type=int, default=26)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    clock = ManualClock()
    clocks = EventClocks(source_timeout_s=30.0, clock=clock)
    sources = [f"node-agent/node-{i}" for i in range(args.sources)]
    partitions = [("topic", p) for p in range(args.partitions)]
    offset = 0
    for name in sources:  # every agent has spoken and vouched once: the steady state
        clocks.heard("c", name)
        clocks.watermark("c", name, 0, final=False)
    clocks.barrier(dict.fromkeys(partitions, 0))
    clocks.settle(dict.fromkeys(partitions, 0))
    clock.now += 30.0
    heard_per_step = round(args.sources * STEP_S / HEARD_EVERY_S)
    marks_per_step = round(args.sources * STEP_S / WATERMARK_EVERY_S)
    parts = {
        "records (newest_ms + heard)": 0.0,
        "watermarks read": 0.0,
        "barrier + settle + limit": 0.0,
        "checkpoint (changed keys dumped)": 0.0,
    }
    written = cycles = 0
    for key in clocks.changed():  # the first checkpoint writes every source once
        clocks.dump(key)
    began = time.process_time()
    for step in range(args.steps):
        clock.now += STEP_S
        event_ms = round(clock.now * 1000)
        t0 = time.process_time()
        for i in range(heard_per_step):
            name = sources[(step * heard_per_step + i) % args.sources]
            clocks.newest_ms("c")
            clocks.heard("c", name)
        t1 = time.process_time()
        for i in range(marks_per_step):
            name = sources[(step * marks_per_step + i) % args.sources]
            clocks.watermark("c", name, event_ms, final=False, produced_ms=event_ms)
        t2 = time.process_time()
        offset += heard_per_step + marks_per_step
        ends = dict.fromkeys(partitions, offset)
        if clocks.wants_barrier:
            clocks.barrier(ends)
        clocks.settle(ends, dict.fromkeys(partitions, event_ms))
        clocks.limit("c")
        clocks.ended("c")
        t3 = time.process_time()
        if step % CYCLE_STEPS == CYCLE_STEPS - 1:
            written += sum(
                len(json.dumps([*key])) + len(json.dumps(clocks.dump(key))) for key in clocks.changed()
            )
            cycles += 1
        t4 = time.process_time()
        parts["checkpoint (changed keys dumped)"] += t4 - t3
        parts["records (newest_ms + heard)"] += t1 - t0
        parts["watermarks read"] += t2 - t1
        parts["barrier + settle + limit"] += t3 - t2
    total = time.process_time() - began
    print(
        f"{args.sources} sources, {args.partitions} partitions, {args.steps} steps of {STEP_S:g} s "
        f"({heard_per_step} records and {marks_per_step} watermarks a step)"
    )
    per_step = total / args.steps
    print(f"clocks CPU per step: {per_step * 1000:.2f} ms ({per_step / STEP_S:.1%} of a core)")
    for name, seconds in parts.items():
        print(f"  {name}: {seconds / args.steps * 1000:.2f} ms")
    print(f"checkpoint: {written / max(cycles, 1) / 1000:.1f} kB written per 1 s cycle")
    print(f"cluster time at the end: {clocks.time('c')} ms (simulated now {round(clock.now * 1000)} ms)")


if __name__ == "__main__":
    main()
