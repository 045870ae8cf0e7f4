"""Sample batches the worker holds as their bytes, compressed in chunks per partition: every
value comes back byte for byte, whether asked for before its chunk is sealed or after, in any
order, across chunk edges and next to another partition's values."""

from __future__ import annotations

import random

from gpulens.pipeline.held_chunks import CHUNK_MOST, HeldChunks, PackedValue

TOPIC = "gpulens.gpu.samples.v1"


def _values(seed: str, count: int) -> list[bytes]:
    rng = random.Random(seed)
    alike = bytes(rng.randrange(256) for _ in range(900))  # batches of a fetch are much alike
    return [
        b""
        if i % 17 == 0
        else alike[: rng.randrange(1, 900)] + i.to_bytes(4, "big") + rng.randbytes(rng.randrange(40))
        for i in range(count)
    ]


def test_values_held_on_one_partition_come_back_as_they_were_across_chunk_edges() -> None:
    values = _values("edges", 2 * CHUNK_MOST + 5)
    chunks = HeldChunks()
    held = [chunks.hold(TOPIC, 0, value) for value in values]
    chunks.seal()
    assert [h.value() for h in held] == values


def test_a_value_asked_for_before_its_chunk_is_sealed_is_the_value_held() -> None:
    chunks = HeldChunks()
    held = chunks.hold(TOPIC, 0, b"\x00\x00\x00\x00\x01batch")
    assert held.value() == b"\x00\x00\x00\x00\x01batch"
    chunks.seal()
    assert held.value() == b"\x00\x00\x00\x00\x01batch"


def test_partitions_held_in_turns_each_get_their_own_values_back_in_any_order() -> None:
    chunks = HeldChunks()
    values = {p: _values(f"partition-{p}", CHUNK_MOST + 9) for p in range(3)}
    held: list[tuple[bytes, PackedValue]] = []
    for i in range(CHUNK_MOST + 9):
        for partition in range(3):
            held.append((values[partition][i], chunks.hold(TOPIC, partition, values[partition][i])))
        if i % 10 == 9:
            chunks.seal()  # a fetch ends
    chunks.seal()
    random.Random("order").shuffle(held)
    for value, packed in held:
        assert packed.value() == value
