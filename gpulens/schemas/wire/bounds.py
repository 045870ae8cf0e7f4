"""Expressions of Avro values that keep the event model's rules (finite, ``ge``, ``le``, ...).

The shapes' expressions (:mod:`gpulens.schemas.wire.publishable`) prove a body decodes; these
make them prove it also validates, for the constraints the models use: a double finite, at
least 0 and at most a bound; a long at least 0; a timestamp within the model's time bounds; a
string at least so long. Each expression matches only values that keep the rule (sound), not necessarily every
such value (a ``-0.0``, a timestamp after 2039): what it does not match is decoded exactly. A
constraint without an expression here is :class:`Unsupported`, and the topic is decoded
exactly.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from annotated_types import Ge, Le, Lt, MinLen

__all__ = ["Unsupported", "double", "long", "min_length", "timestamp"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
_SIX_BYTES = 35
"""Bits below the sixth byte of a varint: a six-byte varint's last byte counts 2**35 each."""


class Unsupported(Exception):
    """A constraint no expression here keeps: the values it applies to are decoded exactly."""


def _bounds(checks: Sequence[Any], allowed: tuple[type, ...]) -> dict[type, Any]:
    found = {type(check): check for check in checks}
    if set(found) - set(allowed) or len(found) != len(checks):
        raise Unsupported(f"constraints {list(checks)}")
    return found


def double(checks: Sequence[Any], *, finite: bool) -> bytes:
    """An 8-byte little-endian double keeping ``checks``: none, or ``ge=0`` with an optional
    ``le``; finite when ``finite`` (a positive double's bits order as its value, so at most a
    bound is at most the bound's bits)."""
    bounds = _bounds(checks, (Ge, Le))
    if Ge not in bounds:
        if Le in bounds:
            raise Unsupported("an upper bound without a lower one")
        # Infinities and NaN have every exponent bit set: bits 4-7 of byte 6 and 0-6 of byte 7.
        return rb".{6}(?:[\x00-\xef].|[\xf0-\xff][^\x7f\xff])" if finite else rb".{8}"
    if bounds[Ge].ge != 0:
        raise Unsupported(f"ge={bounds[Ge].ge}")
    if Le not in bounds:  # the sign bit clear (and, finite, not every exponent bit set)
        return rb".{6}(?:[\x00-\xef][\x00-\x7f]|[\xf0-\xff][\x00-\x7e])" if finite else rb".{7}[\x00-\x7f]"
    top = float(bounds[Le].le)
    if not 0 <= top < math.inf:  # NaN too
        raise Unsupported(f"le={top}")
    return _at_most(struct.pack("<d", top))


def _at_most(limit: bytes) -> bytes:
    """Little-endian unsigned integers of ``len(limit)`` bytes at most ``limit``'s; the likeliest
    case first (a lower most significant byte), so that a typical value matches at once."""
    alternatives = []
    for k in reversed(range(len(limit))):
        if limit[k]:
            below = b"[\\x00-\\x%02x]" % (limit[k] - 1)
            alternatives.append(b".{%d}" % k + below + re.escape(limit[k + 1 :]))
    return b"(?:" + b"|".join([*alternatives, re.escape(limit)]) + b")"


_EVEN = b"".join(b"\\x%02x" % b for b in range(0, 128, 2))
_EVEN_MORE = b"".join(b"\\x%02x" % b for b in range(128, 256, 2))


def long(checks: Sequence[Any], *, plain: bytes) -> bytes:
    """A zig-zag varint keeping ``checks``: none (``plain``) or ``ge=0`` (an even first byte)."""
    bounds = _bounds(checks, (Ge,))
    if not bounds:
        return plain
    if bounds[Ge].ge != 0:
        raise Unsupported(f"ge={bounds[Ge].ge}")
    return b"(?:[" + _EVEN + rb"]|[" + _EVEN_MORE + rb"][\x80-\xff]{0,8}[\x00-\x7f])"


def timestamp(checks: Sequence[Any], *, plain: bytes) -> bytes:
    """A timestamp-millis keeping ``checks``: none (``plain``), or a lower bound after 1971 with
    an upper one after 2039: then six-byte varints of non-negative times whose last byte makes
    them at least the lower bound (a sound part of the range: mid-2000 to 2039 for 2000-2100)."""
    if not checks:
        return plain
    bounds = _bounds(checks, (Ge, Lt))
    if set(bounds) != {Ge, Lt}:
        raise Unsupported(f"timestamp constraints {list(checks)}")
    low = (bounds[Ge].ge - _EPOCH) // _MS
    high = (bounds[Lt].lt - _EPOCH) // _MS
    least = -(-2 * low >> _SIX_BYTES)  # the smallest last byte: 2 * t >= least * 2**35
    if not 0 < least <= 0x7F or high < 1 << (6 * 7 - 1):
        raise Unsupported(f"time bounds {bounds[Ge].ge} to {bounds[Lt].lt}")
    return b"[" + _EVEN_MORE + rb"][\x80-\xff]{4}[" + b"\\x%02x" % least + rb"-\x7f]"


def min_length(checks: Sequence[Any]) -> int:
    """The shortest string ``checks`` allow (0 when none)."""
    bounds = _bounds(checks, (MinLen,))
    return bounds[MinLen].min_length if bounds else 0
