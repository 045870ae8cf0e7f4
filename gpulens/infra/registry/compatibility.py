"""Avro compatibility levels, checked with the Apache ``avro`` library's reader/writer rules."""

from __future__ import annotations

import avro.schema
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType

LEVELS = (
    "NONE",
    "BACKWARD",
    "BACKWARD_TRANSITIVE",
    "FORWARD",
    "FORWARD_TRANSITIVE",
    "FULL",
    "FULL_TRANSITIVE",
)


def parse(text: str) -> avro.schema.Schema:
    """Parse an Avro schema; ``avro.errors.SchemaParseException`` and ``ValueError`` on bad ones."""
    return avro.schema.parse(text)


def check(level: str, candidate: str, existing: list[str]) -> list[str]:
    """Why ``candidate`` breaks ``level`` against ``existing`` (oldest first); empty when it does not."""
    if level == "NONE" or not existing:
        return []
    against = existing if level.endswith("_TRANSITIVE") else existing[-1:]
    new = parse(candidate)
    problems: list[str] = []
    for old_text in against:
        old = parse(old_text)
        if level.startswith(("BACKWARD", "FULL")):
            problems += _problems(reader=new, writer=old, direction="new schema cannot read old data")
        if level.startswith(("FORWARD", "FULL")):
            problems += _problems(reader=old, writer=new, direction="old schema cannot read new data")
    return problems


def _problems(*, reader: avro.schema.Schema, writer: avro.schema.Schema, direction: str) -> list[str]:
    result = ReaderWriterCompatibilityChecker().get_compatibility(reader, writer)
    if result.compatibility is SchemaCompatibilityType.compatible:
        return []
    kinds = ", ".join(sorted({i.value.replace("_", " ") for i in result.incompatibilities}))
    details = "; ".join(sorted(result.messages))
    return [f"{direction}: {kinds} ({details}) at {', '.join(sorted(result.locations))}"]
