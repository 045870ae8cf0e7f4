"""Deterministic event ids: the same observation always gets the same id, so sinks can dedup."""

from __future__ import annotations

import hashlib
from collections.abc import Callable


def _text(parts: tuple[object, ...]) -> str:
    # A list, not a generator, and a str taken as it is: 323 ns against 455 for four strings.
    return "\x1f".join(["\x00" if p is None else p if type(p) is str else str(p) for p in parts])


def event_id(*parts: object) -> str:
    """A 128-bit hex id derived from ``parts`` (order matters; ``None`` is distinct from "")."""
    return hashlib.blake2b(_text(parts).encode(), digest_size=16).hexdigest()


def event_ids_after(*parts: object) -> Callable[..., str]:
    """``rest -> event_id(*parts, *rest)``, with ``parts`` hashed once: for a producer that ids
    the same entity's observations over and over (the simulator, 6,250 sample batches a second)."""
    head = hashlib.blake2b((_text(parts) + "\x1f").encode(), digest_size=16)

    def after(*rest: object) -> str:
        digest = head.copy()
        digest.update(_text(rest).encode())
        return digest.hexdigest()

    return after
