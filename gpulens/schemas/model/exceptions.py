"""Errors of the shared core.

    GPULensError
    ├── ConfigError            a setting is missing or invalid (says which and how to fix it)
    ├── RegistryError          the schema registry refused or could not be reached
    │   └── IncompatibleSchemaError   a new schema version breaks the subject's compatibility level
    └── DecodeError            a record cannot become an event (permanent: goes to the DLQ)

Other subsystems root their own trees at ``GPULensError`` too.
"""

from __future__ import annotations

from enum import StrEnum


class GPULensError(Exception):
    """Root of every error GPULens raises on purpose."""


class ConfigError(GPULensError):
    """A setting is missing or invalid; the message names it and says what to do."""


class RegistryError(GPULensError):
    """The schema registry refused a request or could not be reached."""


class IncompatibleSchemaError(RegistryError):
    """A schema would break the compatibility level of its subject."""


class DecodeFailure(StrEnum):
    """Why a record could not be decoded; each reason is a distinct DLQ label."""

    TRUNCATED = "truncated-header"
    """Shorter than the 5-byte Confluent header (magic byte + schema id)."""
    BAD_MAGIC = "bad-magic-byte"
    """The first byte is not the Confluent magic byte 0: not our wire format."""
    UNKNOWN_SCHEMA_ID = "unknown-schema-id"
    """The registry has no schema with the id in the header."""
    AVRO_DECODE = "avro-decode-error"
    """The body does not decode with the writer schema (truncated, garbage, wrong schema)."""
    INVALID_RECORD = "invalid-record"
    """Valid Avro whose values break the event model's rules."""
    KEY_MISMATCH = "key-mismatch"
    """The key is not the record's: a worker sharded by cluster cannot place a record whose key
    names another cluster, and the gateway publishes only under the key ``record_key`` gives."""


class DecodeError(GPULensError):
    """A record that can never be decoded: retrying will not help, it belongs in the DLQ."""

    def __init__(self, reason: DecodeFailure, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail
