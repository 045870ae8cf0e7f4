"""A field or two of a Confluent-framed Avro value, read without decoding the value.

The sink hands GPU sample batches to ClickHouse undecoded, yet needs their event id (the
conflicting-duplicate check) and how many rows each becomes (batches bounded by rows). Both
sit at the start of the Avro body: the event id is the first field of every event schema, and
a batch's samples follow five fields of fixed kinds. Anything that does not read as expected
gives None: the value is then ClickHouse's, or the Python decoder's, to judge.
"""

from __future__ import annotations

__all__ = ["array_length", "leading_string"]

HEADER = 5
"""Bytes of the Confluent header (magic byte, schema id) before the Avro body."""


def _long(value: bytes, at: int) -> tuple[int, int] | None:
    """The zigzag varint at ``at`` and the position after it."""
    result, shift = 0, 0
    while at < len(value) and shift < 70:
        byte = value[at]
        result |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), at
    return None


def _string_end(value: bytes, at: int) -> int | None:
    read = _long(value, at)
    if read is None or read[0] < 0 or read[1] + read[0] > len(value):
        return None
    return read[1] + read[0]


def leading_string(value: bytes) -> str | None:
    """The first field of the body read as a UTF-8 string (an event's ``event_id``)."""
    read = _long(value, HEADER)
    end = _string_end(value, HEADER)
    if read is None or end is None:
        return None
    try:
        return value[read[1] : end].decode()
    except UnicodeDecodeError:
        return None


def array_length(value: bytes, before: str) -> int | None:
    """Items in the first block of the array that follows the fields ``before`` (one letter
    each: ``s`` string or bytes, ``l`` int or long) at the start of the body. Writers put a
    short array in one block (fastavro always does), so it is the array's length."""
    at = HEADER
    for kind in before:
        if kind == "s":
            end = _string_end(value, at)
        else:
            read = _long(value, at)
            end = None if read is None else read[1]
        if end is None:
            return None
        at = end
    read = _long(value, at)
    return None if read is None else abs(read[0])
