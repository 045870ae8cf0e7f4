"""Damaged Avro bodies: what fast paths must never read differently from an exact decode."""

from __future__ import annotations

import random
from collections.abc import Iterator


def damaged(value: bytes, rng: random.Random, *, header: int = 5) -> Iterator[bytes]:
    """Every prefix, every byte after ``header`` changed to a few others, one byte appended.

    The Confluent wire header (magic byte, schema id) has tests of its own, hence ``header``.
    """
    for length in range(len(value)):
        yield value[:length]
    for index in range(header, len(value)):
        for replacement in {0x00, 0x01, 0x7F, 0x80, 0xFF, rng.randrange(256)} - {value[index]}:
            yield value[:index] + bytes([replacement]) + value[index + 1 :]
    yield value + b"\x00"
