"""Deterministic event ids: the same observation always gets the same id, so sinks can dedup."""

from __future__ import annotations

import hashlib


def event_id(*parts: object) -> str:
    """A 128-bit hex id derived from ``parts`` (order matters; ``None`` is distinct from "")."""
    text = "\x1f".join("\x00" if p is None else str(p) for p in parts)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
