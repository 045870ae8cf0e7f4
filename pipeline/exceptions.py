"""Errors of the stream processors.

GPULensError
└── PipelineError
    └── LateEvent     an event older than what its operator already applied (to the DLQ)
"""

from __future__ import annotations

from schemas.exceptions import GPULensError


class PipelineError(GPULensError):
    """A stream processor cannot go on."""


class LateEvent(PipelineError):
    """An event arrived after event time had passed it: counted and sent to the DLQ."""
