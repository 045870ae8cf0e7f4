"""The simulator's sample batches written by column: the codec's bytes exactly, whatever changes.

:class:`SampleBatchWriter` lays each node's record out once and then writes only the fields
that change; every case here compares its bytes with :meth:`AvroCodec.encode` of the records
the same round stands for, and decodes them back. Rounds are random (node sets, lost and
returning GPUs, integer fields that move the layout, null columns, times on both sides of the
varint's length change, long names) and come from the simulation itself.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime

import numpy as np
import pytest

from gpulens.producers.simulate import ChurnRates, ClusterSimulation, SimulationSpec
from gpulens.producers.simulate.batch_writing import SampleBatchWriter, avro_long
from gpulens.producers.simulate.rounds import SampleRound
from gpulens.producers.simulate.specs import SOURCE, to_ms
from gpulens.schemas.model.ids import event_id, event_ids_after
from gpulens.schemas.model.topics import GPU_SAMPLES, record_key
from gpulens.schemas.wire.codec import AvroCodec

INTS = ("memory_used_bytes", "memory_total_bytes", "ecc_correctable", "ecc_uncorrectable")
FLOATS = (
    "utilization_pct", "temperature_edge_c", "temperature_junction_c", "temperature_memory_c", "power_watts",
    "energy_joules", "sm_clock_mhz", "memory_clock_mhz", "pcie_bandwidth_mbps",
)  # fmt: skip
EDGE_INTS = (0, 1, 63, 64, 8191, 8192, 2**31, 2**40 + 7, 2**62)
"""Where an Avro long's length changes (zig-zag doubles them)."""


class RandomFleet:
    """Nodes of ``per_node`` GPUs whose rounds change at random: which nodes and GPUs report,
    the integer fields, which float columns are null, the time."""

    def __init__(self, rng: random.Random, cluster: str, nodes: int, per_node: int) -> None:
        self.rng, self.cluster, self.per_node = rng, cluster, per_node
        self.names = [f"node-{i}" + "x" * rng.choice((0, 3, 70)) for i in range(nodes)]
        self.device_ids = [
            f"GPU-{rng.getrandbits(64):x}" + "y" * rng.choice((0, 60)) for _ in range(nodes * per_node)
        ]
        self.ints = {
            name: np.array([rng.choice(EDGE_INTS) for _ in self.device_ids], np.int64) for name in INTS
        }

    def round(self, at_ms: int) -> SampleRound:
        rng, per_node = self.rng, self.per_node
        for column in self.ints.values():  # a few integers change: those nodes are laid out again
            for slot in rng.sample(range(len(column)), k=max(1, len(column) // 10)):
                column[slot] = rng.choice(EDGE_INTS) if rng.random() < 0.5 else rng.randrange(2**45)
        reporting = [k for k in range(len(self.names)) if rng.random() < 0.85]
        slots, starts = [], [0]
        for k in reporting:
            present = [g for g in range(per_node) if rng.random() < (0.9 if k % 3 else 0.4)]
            slots += [k * per_node + g for g in present]
            starts.append(len(slots))
        n = len(slots)
        floats = {
            name: None if rng.random() < 0.2 and "temperature_" in name and name != "temperature_edge_c"
            else np.array([rng.choice((0.0, 5e-324, 1e300, rng.uniform(0, 1e4), rng.randrange(100) / 10))
                           for _ in range(n)])
            for name in FLOATS
        }  # fmt: skip
        floats["utilization_pct"] = np.minimum(floats["utilization_pct"], 100.0)  # a percentage
        index = np.array(slots, np.int64) % per_node
        return SampleRound(
            cluster=self.cluster,
            source="bench",
            at_ms=at_ms,
            nodes=[self.names[k] for k in reporting],
            event_ids=[event_id(self.cluster, self.names[k], at_ms) for k in reporting],
            starts=np.array(starts, np.int64),
            slots=np.array(slots, np.int64),
            device_ids=self.device_ids,
            index=index,
            ints={name: column[slots] for name, column in self.ints.items()},
            floats=floats,
        )


def assert_written_as_the_codec_encodes(
    writer: SampleBatchWriter, codec: AvroCodec, round_: SampleRound
) -> int:
    """Every batch of ``round_`` is the codec's encoding of its record and decodes back to it."""
    keys, values = writer.write(round_)
    batches = round_.batches()
    assert len(keys) == len(values) == len(batches) == len(round_.nodes)
    for key, value, batch in zip(keys, values, batches, strict=True):
        assert key == record_key(GPU_SAMPLES, batch)
        assert value == codec.encode(GPU_SAMPLES, batch), f"{batch.node} at {round_.at_ms}"
        assert codec.decode(GPU_SAMPLES, value) == batch
    return len(values)


def test_avro_longs_are_zigzag_varints() -> None:
    assert [avro_long(v) for v in (0, -1, 1, -64, 64, 2**63 - 1)] == [
        b"\x00", b"\x01", b"\x02", b"\x7f", b"\x80\x01", b"\xfe" + b"\xff" * 8 + b"\x01"
    ]  # fmt: skip


@pytest.mark.parametrize("seed", range(6))
def test_random_rounds_are_written_byte_for_byte_as_the_codec_encodes(codec: AvroCodec, seed: int) -> None:
    rng = random.Random(seed)
    fleet = RandomFleet(
        rng, cluster="c" * rng.choice((1, 5, 80)), nodes=rng.randint(1, 40), per_node=rng.choice((1, 8))
    )
    writer = SampleBatchWriter(codec.schema_id(GPU_SAMPLES))
    # Across 2039, where the time's varint grows from 6 to 7 bytes, and back to an earlier time.
    times = [to_ms(datetime(2039, 1, 1, tzinfo=UTC)) + step * 90 * 86_400_000 for step in range(-2, 6)]
    times += [to_ms(datetime(2000, 1, 1, tzinfo=UTC)), to_ms(datetime(2099, 12, 31, tzinfo=UTC))]
    written = sum(assert_written_as_the_codec_encodes(writer, codec, fleet.round(at)) for at in times)
    assert written > len(times)


def test_one_writer_takes_rounds_of_one_cluster_only(codec: AvroCodec) -> None:
    writer = SampleBatchWriter(codec.schema_id(GPU_SAMPLES))
    at = to_ms(datetime(2025, 1, 1, tzinfo=UTC))
    writer.write(RandomFleet(random.Random(1), "a", 2, 2).round(at))
    with pytest.raises(ValueError, match="got a round of"):
        writer.write(RandomFleet(random.Random(1), "b", 2, 2).round(at))


@pytest.mark.parametrize("gpu_model", ["h100", "mi300x"])
def test_the_simulations_rounds_are_written_as_the_codec_encodes(codec: AvroCodec, gpu_model: str) -> None:
    """Pods start and end (memory used moves), GPUs are lost and come back, nodes go NotReady,
    are removed and replaced; NVIDIA reports one temperature (two null columns), AMD three."""
    spec = SimulationSpec(
        nodes=8, gpus_per_node=8, interval_s=10.0, start=datetime(2025, 1, 1, tzinfo=UTC),
        duration_s=3 * 3600.0, cluster="sim-writing", seed=5, gpu_model=gpu_model, load=1.2,
        pod_duration_s=300.0, churn=1.0,
        churn_rates=ChurnRates(not_ready=2.0, removed=0.5, gpu_lost=2.0, gpu_back_after_s=(60, 600)),
    )  # fmt: skip
    writer = SampleBatchWriter(codec.schema_id(GPU_SAMPLES))
    rounds = [item for _, item in ClusterSimulation(spec).stream() if isinstance(item, SampleRound)]
    written = sum(assert_written_as_the_codec_encodes(writer, codec, round_) for round_ in rounds)
    assert written > len(rounds) * spec.nodes // 2
    assert all(
        round_.event_ids
        == [event_id(spec.cluster, SOURCE, node, "gpu-samples", round_.at_ms) for node in round_.nodes]
        for round_ in rounds
    )
    sizes = {len(round_.nodes) for round_ in rounds}
    samples = {int(n) for round_ in rounds for n in np.diff(round_.starts)}
    assert len(sizes) > 1 and len(samples) > 1, "no node was ever NotReady, or no GPU lost"


def test_ids_after_shared_parts_are_the_ids_of_all_the_parts() -> None:
    after = event_ids_after("cluster", None, "node-1", "")
    for rest in [(0,), (1732400000123,), (None, "x"), ("", 5)]:
        assert after(*rest) == event_id("cluster", None, "node-1", "", *rest)
