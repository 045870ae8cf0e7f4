"""The sink's duplicate check remembers the newest ids of its horizon, whichever generation
holds them, and forgets only what leaves it or what it is told to forget."""

from __future__ import annotations

import pytest

from gpulens.consumers.clickhouse.duplicates import DuplicateGuard

HEADER = b"\x00\x00\x00\x00\x07"


def body(i: int) -> bytes:
    return HEADER + i.to_bytes(8, "little")


def other(i: int) -> bytes:
    return HEADER + b"other" + i.to_bytes(8, "little")


@pytest.mark.parametrize("horizon", [2, 10, 1_000, 20_000])
def test_the_newest_nine_tenths_of_the_horizon_are_guarded_and_ids_past_it_are_not(horizon: int) -> None:
    ids = 3 * horizon
    guarded = horizon - max(1, horizon // 10)
    for probe in range(ids - guarded, ids):  # every id of the guarded part, one guard each
        guard = DuplicateGuard(horizon)
        for i in range(ids):
            assert guard.conflict_of(f"id-{i}", body(i)) is None
        assert guard.conflict_of(f"id-{probe}", other(probe)) is not None, probe
        assert guard.conflict_of(f"id-{ids - horizon - 1}", other(ids - horizon - 1)) is None
        if horizon > 10:
            break  # the oldest guarded one is enough at scale


def test_an_id_seen_again_is_remembered_as_first_seen_for_another_horizon() -> None:
    guard = DuplicateGuard(100)
    guard.conflict_of("kept", body(0))
    for i in range(1_000):
        guard.conflict_of(f"id-{i}", body(i))
        if i % 50 == 0:
            assert guard.conflict_of("kept", body(0)) is None  # the same: seen again, remembered anew
    assert guard.conflict_of("kept", other(0)) is not None


def test_a_forgotten_id_is_first_seen_again_in_any_generation() -> None:
    guard = DuplicateGuard(1_000)
    guard.conflict_of("young", body(1))
    guard.forget("young", body(1))
    assert guard.conflict_of("young", other(1)) is None, "forgotten while in the newest tenth"
    guard.conflict_of("older", body(2))
    for i in range(300):  # "older" and "young" leave the newest tenth
        guard.conflict_of(f"id-{i}", body(i))
    guard.forget("older", other(2))  # not the content remembered: stays
    assert guard.conflict_of("older", other(2)) is not None
    guard.forget("older", body(2))
    assert guard.conflict_of("older", other(2)) is None, "forgotten in the older generations"
    assert guard.conflict_of("young", body(1)) is not None, "what it was first seen with after"


def test_ids_whose_hashes_agree_in_their_low_bits_are_told_apart_by_the_whole_hash() -> None:
    """Ids whose hashes agree in their lowest byte, held in the arrays, each keep their own content."""
    guard = DuplicateGuard(400)
    same_bit = [str(i) for i in range(300_000) if hash(str(i)) & 0xFF == 0][:300]
    for i, key in enumerate(same_bit):
        assert guard.conflict_of(key, body(i)) is None
    assert all(guard.conflict_of(key, body(i)) is None for i, key in enumerate(same_bit))
    assert all(guard.conflict_of(key, other(i)) is not None for i, key in enumerate(same_bit))
